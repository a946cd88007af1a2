"""Render a farm's files through Ansible: the roles' own render entry points, one playbook run on this box.

Ansible is the one renderer of what goes onto a host. `fdl join-config` runs the collection's
`join_config.yml` (playbooks/join_config.yml) here, with a local connection, as the invoking account:

- the fdl_join_door role's render entry point renders the sshd drop-in the role installs (`sshd-door.conf`,
  the review copy) from its own template, planned from this box's sshd configuration by the role's module;
- the fdl_join_worker role's render entry point renders what the role puts on a worker: `fdl.yml` (the farm's
  worker.yml), the unit, `known_hosts` (the door's host keys) and, when asked, cloud-init user-data carrying
  exactly those texts, the farm key and the token;
- fdl's own project templates (templates/farm/: the env overlay and the door self-test) are rendered in the
  same play, so the wizard renders nothing itself.

The texts come back as facts (fdl_join_door_render, fdl_join_worker_render, fdl_join_config_render), read from
the runner's events: Ansible's templar renders them in its own process, with no module run per file. The
user-data, which holds the key and the token, is the one file the play writes, 0600, into a private directory
the caller names, and is never returned in an event. The caller reads everything back and checks it
(fdl.farm.readback) before anything is put in place. Secrets reach the play only through the runner's 0600
variables file (fdl.cluster.runner), and the task that writes them is no_log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdl.errors import FdlError
from fdl.resources import templates_dir

PLAYBOOK = "join_config.yml"
PLAYBOOK_FQCN = "flodl.fdl.join_config"
# The parts of the play (fdl_join_config_parts): the door's drop-in, a worker's files, the farm's project files.
DOOR, WORKER, PROJECT = "door", "worker", "project"
# The drop-in's header, in the copy the wizard keeps for review and in the file the fdl_join_door role installs.
DROPIN_MANAGED = ("Written by fdl join-config; the fdl_join_door role installs it as it is (re-run the wizard to "
                  "change it).")
# The facts the play's parts set, and the names of the texts in them.
FACTS = ("fdl_join_door_render", "fdl_join_worker_render", "fdl_join_config_render")
DROPIN_FILE, WORKER_FILE, KNOWN_HOSTS_FILE, CLOUD_INIT_FILE = "sshd-door.conf", "fdl.yml", "known_hosts", \
    "cloud-init.yml"
OVERLAY_FILE, SELFTEST_FILE = "overlay.yml", "door-selftest.sh"


@dataclass(frozen=True)
class Rendered:
    """The texts the play rendered (None: a part or file not asked for)."""

    dropin: str | None
    worker_yml: str | None
    unit: str | None
    known_hosts: str | None
    cloud_init: str | None
    overlay: str | None
    selftest: str | None


def project_templates() -> dict[str, str]:
    """fdl's own farm templates the play renders: the env overlay and the door self-test."""
    folder = templates_dir() / "farm"
    return {OVERLAY_FILE: str(folder / "overlay.yml.j2"), SELFTEST_FILE: str(folder / "door-selftest.sh.j2")}


def _text(value: Any) -> str | None:
    """A rendered text as Ansible returned it, ending in exactly one newline like the file the role writes."""
    if not isinstance(value, str):
        return None
    return value.rstrip("\n") + "\n"


def render(variables: dict[str, Any], directory: Path, parts: tuple[str, ...] = (DOOR, WORKER, PROJECT),
           unit_name: str = "flodl-join.service") -> Rendered:
    """Run the render play and return what it rendered; user-data (when asked for) goes to `directory`, which
    must exist and be private to this user.

    `variables` are the roles' variables (fdl_join_door_*, fdl_join_worker_*) and the project templates'
    (fdl_join_config). Raises FdlError (exit 1) when the play fails, naming the task and Ansible's message;
    nothing outside `directory` is written."""
    from fdl.cluster.events import OK, RunnerEvent
    from fdl.cluster.inventory import local_inventory
    from fdl.cluster.runner import run_playbook

    facts: dict[str, dict[str, Any]] = {}

    def on_event(event: RunnerEvent) -> None:
        if event.kind == "on_ok" and isinstance(event.res, dict):
            for name, value in (event.res.get("ansible_facts") or {}).items():
                if name in FACTS and isinstance(value, dict):
                    facts[name] = value

    extravars = {**variables, "fdl_join_config_parts": list(parts),
                 "fdl_join_worker_render_dir": str(directory.resolve()),
                 "fdl_join_config_templates": project_templates() if PROJECT in parts else {}}
    result = run_playbook(PLAYBOOK, local_inventory(), extravars=extravars, on_event=on_event, progress=False,
                          title="join-config")
    host = next(iter(result.hosts.values()))
    if host.status != OK:
        failed = next((t for t in reversed(host.tasks) if t.status not in (OK, "skipped")), None)
        task = failed.task if failed is not None else "the play"
        why = host.message or (failed.status if failed is not None else host.status)
        raise FdlError(f"Ansible could not render the farm's files ({task}: {why}). Nothing was written.",
                       hint="fix what the message names, then run join-config again", exit_code=1)
    door, worker, project = (facts.get(name, {}) for name in FACTS)
    try:
        cloud_init: str | None = (directory / CLOUD_INIT_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        cloud_init = None
    return Rendered(dropin=_text(door.get(DROPIN_FILE)), worker_yml=_text(worker.get(WORKER_FILE)),
                    unit=_text(worker.get(unit_name)), known_hosts=_text(worker.get(KNOWN_HOSTS_FILE)),
                    cloud_init=cloud_init, overlay=_text(project.get(OVERLAY_FILE)),
                    selftest=_text(project.get(SELFTEST_FILE)))
