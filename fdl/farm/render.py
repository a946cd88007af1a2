"""Render the farm's files from the shipped jinja2 templates.

The sshd drop-in template belongs to the fdl_join_door role, and the wizard
renders that very file, with the same whitespace rules as Ansible's template
module (trim_blocks, trailing newline kept) and stand-ins for the
Ansible-only names the templates use (`ansible_managed`, the `comment` and
`bool` filters). The systemd unit in cloud-init user-data is likewise the
fdl_join_worker role's own templates/fdl-join.service.j2, the file the role installs.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path

import jinja2

from fdl.resources import roles_dir, templates_dir

DROPIN_TEMPLATE = ("fdl_join_door", "sshd-door.conf.j2")
UNIT_TEMPLATE = ("fdl_join_worker", "fdl-join.service.j2")
MANAGED = "Written by fdl join-config; install it as it is (re-run the wizard to change it)."
# The drop-in's header, in the copy the wizard writes for review and in the file the fdl_join_door role installs.
DROPIN_MANAGED = ("Written by fdl join-config; the fdl_join_door role installs it as it is (re-run the wizard to "
                  "change it).")


def comment(text: str) -> str:
    """Ansible's `comment` filter, plain style: the text framed by '#' lines."""
    body = "\n".join(f"# {line}" if line else "#" for line in str(text).splitlines())
    return f"#\n{body}\n#"


def to_bool(value: object) -> bool:
    """Ansible's `bool` filter: yes/on/1/true (any case) are true."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("yes", "on", "1", "true", "y", "t")


@cache
def _env(folder: str) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), trim_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["comment"] = comment
    env.filters["bool"] = to_bool
    return env


def render(name: str, **values: object) -> str:
    """A template from templates/farm/."""
    text = _env(str(templates_dir() / "farm")).get_template(name).render(**values)
    return text if text.endswith("\n") else text + "\n"


def render_unit(managed: str = MANAGED, **values: object) -> str:
    """The `fdl join --persist` systemd unit, from the fdl_join_worker role's fdl-join.service.j2 (its variables)."""
    folder = str(roles_dir() / UNIT_TEMPLATE[0] / "templates")
    return _env(folder).get_template(UNIT_TEMPLATE[1]).render(ansible_managed=managed, **values)


def dropin_template_path() -> Path:
    return roles_dir() / DROPIN_TEMPLATE[0] / "templates" / DROPIN_TEMPLATE[1]


def render_dropin(values: Mapping[str, object], managed: str = DROPIN_MANAGED) -> str:
    """The sshd drop-in, from the role's own template: with the role's fdl_join_door_managed set to `managed`,
    the file the role installs is this text byte for byte."""
    folder = str(dropin_template_path().parent)
    return _env(folder).get_template(DROPIN_TEMPLATE[1]).render(ansible_managed=managed,
                                                                fdl_join_door_managed=managed, **values)
