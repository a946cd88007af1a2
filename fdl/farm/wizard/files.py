"""Files: what the render play is given for a farm, and what each rendered file must read back as.

The wizard renders nothing itself: fdl.farm.render runs the roles' render entry points with the variables
composed here (the fdl_join_door role's for the drop-in, the fdl_join_worker role's for the worker's fdl.yml,
unit, known_hosts and user-data, fdl's project templates' for the overlay and the self-test), and
check_rendered() reads every text back against what the wizard meant (fdl.farm.readback) before apply.py
writes any of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdl.farm import credentials as creds_mod
from fdl.farm import readback
from fdl.farm.overlay import read_crate
from fdl.farm.render import DROPIN_MANAGED, Rendered, render
from fdl.farm.wizard.plan import Plan
from fdl.farm.wizard.report import spell_path
from fdl.farm.wizard.shape import refusal
from fdl.farm.wizard.steps import SELFTEST, WORKER_DIR
from fdl.hostside.farm.doors import DOOR_A, DOOR_B, DOOR_TUNNEL, JAIL_DATA, TITLES, jail

# cloud-init's unit: the fdl_join_worker role's templates/fdl-join.service.j2 under the name the role gives it,
# running the fdl the image put on PATH, as the account the role creates.
CLOUD_UNIT = "flodl-join.service"
CLOUD_UNIT_DIR = "/etc/systemd/system"
CLOUD_USER = "flodl"
CLOUD_FDL = "/usr/bin/env fdl"


@dataclass(frozen=True)
class Pending:
    """The credentials the farm will have once the render checks out: found ones, or new ones not yet in place."""

    key: Path
    public_key: str
    token: str
    staged: creds_mod.Staged | None


def worker_dir(label: str) -> str:
    return WORKER_DIR.format(label=label)


def _marker(plan: Plan) -> dict[str, str]:
    """The farm's shape line (door, served, jail): re-runs recover the farm from the worker yml."""
    shape = plan.shape
    out = {"door": shape.door}
    if shape.served:
        out["served"] = shape.served
    if shape.door == DOOR_A:
        out["jail"] = shape.jail_base
    return out


def _header(plan: Plan) -> str:
    """The worker yml's header (fdl_join_worker_managed): what it is, where it goes, the shape line."""
    label, shape, where = plan.label, plan.shape, worker_dir(plan.label)
    lines = [f"Worker side of farm {label} (door {shape.door}: {TITLES[shape.door]}),",
             f"from `fdl join-config {label}`. On a worker it is {where}/fdl.yml, beside",
             f"the farm key ({where}/key, 0600), the token ({where}/token, 0600) and",
             f"the door's host keys ({where}/known_hosts); run `fdl join` in {where}.",
             "It holds no secret itself."]
    if shape.door != DOOR_B:
        lines.append(f"Door {shape.door} carries no training source: add bin: (the training binary on the")
        lines.append("worker) or a source: of your own before `fdl join` runs.")
    lines.append("fdl-farm-shape: " + " ".join(f"{k}={v}" for k, v in _marker(plan).items()))
    return "\n".join(lines)


def expected_join(plan: Plan) -> dict[str, Any]:
    """The worker's join: block as the wizard means it (what the render must read back as)."""
    shape, where = plan.shape, worker_dir(plan.label)
    block: dict[str, Any] = {"controller": f"127.0.0.1:{shape.controller_port}", "ssh": shape.controller,
                             "identity": f"{where}/key"}
    if plan.host_keys:
        block["known_hosts"] = f"{where}/known_hosts"
    block["token_file"] = f"{where}/token"
    if shape.door == DOOR_B:
        block["source"] = f"rsync://{shape.user}@{shape.host}:{shape.door_port}:/tree"
    elif shape.door == DOOR_A:
        block["data_path"] = shape.served
        block["data_source"] = f"sshfs://{shape.user}@{shape.host}:{shape.door_port}:{JAIL_DATA}"
    block["persist"] = True
    return block


def _worker_vars(plan: Plan, pending: Pending) -> dict[str, Any]:
    """The fdl_join_worker role's variables for this farm's worker."""
    block, where = expected_join(plan), worker_dir(plan.label)
    return {
        "fdl_join_worker_controller": block["controller"],
        "fdl_join_worker_ssh": block["ssh"],
        "fdl_join_worker_identity": block["identity"],
        "fdl_join_worker_identity_src": str(pending.key),
        "fdl_join_worker_token": pending.token,
        "fdl_join_worker_token_file": block["token_file"],
        "fdl_join_worker_known_hosts": block.get("known_hosts", ""),
        "fdl_join_worker_door_host_keys": list(plan.host_keys),
        "fdl_join_worker_source": block.get("source", ""),
        "fdl_join_worker_data_path": block.get("data_path", ""),
        "fdl_join_worker_join_extra": {"data_source": block["data_source"]} if "data_source" in block else {},
        "fdl_join_worker_user": CLOUD_USER,
        "fdl_join_worker_group": CLOUD_USER,
        "fdl_join_worker_config_dir": where,
        "fdl_join_worker_unit_dir": CLOUD_UNIT_DIR,
        "fdl_join_worker_unit_name": CLOUD_UNIT,
        "fdl_join_worker_unit_exec": CLOUD_FDL,
        "fdl_join_worker_managed": _header(plan),
        "fdl_join_worker_render_cloud_init": plan.cloud_init,
    }


def _door_vars(plan: Plan, public_key: str) -> dict[str, Any]:
    """The fdl_join_door role's variables for the render entry point (the drop-in for review)."""
    shape = plan.shape
    return {
        "fdl_join_door_label": plan.label,
        "fdl_join_door_door": shape.door,
        "fdl_join_door_port": shape.door_port,
        "fdl_join_door_controller_port": shape.controller_port,
        "fdl_join_door_jail_base": shape.jail_base,
        "fdl_join_door_sshd_config": plan.sshd_config,
        "fdl_join_door_sshd_config_dir": str(Path(plan.dropin_target).parent),
        "fdl_join_door_managed": DROPIN_MANAGED,
        "fdl_join_door_public_key": public_key.strip(),
    }


def overlay_token_file(plan: Plan) -> str:
    """The farm's token file as the overlay names it: relative to the overlay's own directory."""
    return os.path.relpath(plan.farm_dir / creds_mod.TOKEN_NAME, plan.overlay.parent)


def _project_vars(plan: Plan, cwd: Path) -> dict[str, Any]:
    """fdl's project templates' values (templates/farm/: the overlay and the self-test)."""
    shape, crate = plan.shape, read_crate(plan.root)
    return {"fdl_join_config": {
        "label": plan.label, "door": shape.door, "door_title": TITLES[shape.door], "served": shape.served,
        "user": shape.user, "host": shape.host, "door_port": shape.door_port,
        "controller_port": shape.controller_port, "script": spell_path(plan.farm_dir / SELFTEST, cwd),
        "inherit_from": plan.inherit_from, "tunnel": shape.door == DOOR_TUNNEL,
        "token_file": overlay_token_file(plan),
        "crate": {"name": crate.name, "bin": crate.bin} if crate else None}}


# --------------------------------------------------------------------------- render, then read back


def render_farm(plan: Plan, pending: Pending, cwd: Path, directory: Path) -> Rendered:
    """Every file of the farm, rendered by the render play into `directory` (user-data) and as texts."""
    variables = {**_door_vars(plan, pending.public_key), **_worker_vars(plan, pending), **_project_vars(plan, cwd)}
    return render(variables, directory, unit_name=CLOUD_UNIT)


def check_rendered(plan: Plan, pending: Pending, done: Rendered) -> None:
    """Every rendered file read back against what the wizard meant; FdlError (exit 1) on the first that is not."""
    shape, where = plan.shape, worker_dir(plan.label)
    texts = {"worker.yml": done.worker_yml, "sshd-door.conf": done.dropin, "the overlay": done.overlay,
             "door-selftest.sh": done.selftest, "the unit": done.unit}
    if plan.host_keys:
        texts["known_hosts"] = done.known_hosts
    if plan.cloud_init:
        texts["cloud-init.yml"] = done.cloud_init
    missing = [name for name, text in texts.items() if text is None]
    if missing:
        raise refusal(f"the render play wrote no {', '.join(missing)}. Nothing was written.")
    assert done.worker_yml is not None and done.dropin is not None and done.overlay is not None
    assert done.selftest is not None and done.unit is not None
    readback.check_worker_yml(done.worker_yml, expected_join(plan), _marker(plan))
    ports = [int(item["port"]) for item in plan.dropin["ports"]]  # type: ignore[attr-defined]
    readback.check_dropin(done.dropin, shape.door_port, ports,
                          jail(plan.label, shape.jail_base).account if shape.door == DOOR_A else None)
    readback.check_overlay(done.overlay, overlay_token_file(plan), shape.host, shape.controller_port,
                           spell_path(plan.overlay, plan.root))
    readback.check_selftest(done.selftest)
    if plan.host_keys:
        assert done.known_hosts is not None
        readback.check_known_hosts(done.known_hosts, list(plan.host_keys))
    if plan.cloud_init:
        assert done.cloud_init is not None
        owner = f"{CLOUD_USER}:{CLOUD_USER}"
        key_text = pending.key.read_text()
        files = {f"{where}/key": readback.CloudFile(key_text, "0600", owner, defer=True),
                 f"{where}/token": readback.CloudFile(pending.token + "\n", "0600", owner, defer=True),
                 f"{where}/fdl.yml": readback.CloudFile(done.worker_yml, "0600", owner, defer=True),
                 f"{CLOUD_UNIT_DIR}/{CLOUD_UNIT}": readback.CloudFile(done.unit, "0644")}
        if plan.host_keys:
            files[f"{where}/known_hosts"] = readback.CloudFile("\n".join(plan.host_keys) + "\n", "0644")
        readback.check_cloud_init(done.cloud_init, files, CLOUD_USER, CLOUD_UNIT, secrets=(key_text, pending.token))
