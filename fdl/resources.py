"""Where the Ansible content shipped with fdl lives at run time.

From a clone (`pip install -e .`) the playbooks, roles, templates and the
inventory plugin sit at the repository root, next to the package. A built
wheel carries the same directories inside the package as `fdl/_share/`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_KINDS = ("playbooks", "roles", "templates", "inventory_plugins")


@lru_cache(maxsize=None)
def share_dir() -> Path:
    """The directory holding playbooks/, roles/, templates/ and inventory_plugins/."""
    for candidate in (PACKAGE_DIR / "_share", PACKAGE_DIR.parent):
        if all((candidate / kind).is_dir() for kind in _KINDS):
            return candidate
    raise FileNotFoundError(
        f"fdl's Ansible content (playbooks/, roles/, templates/, inventory_plugins/) was not found "
        f"next to {PACKAGE_DIR}; reinstall fdl"
    )


def playbook(name: str) -> Path:
    """Path of a shipped playbook, e.g. playbook('probe.yml')."""
    return share_dir() / "playbooks" / name


def roles_dir() -> Path:
    return share_dir() / "roles"


def templates_dir() -> Path:
    return share_dir() / "templates"


def inventory_plugins_dir() -> Path:
    return share_dir() / "inventory_plugins"


def ansible_cfg() -> Path:
    """The shipped ansible.cfg (its relative paths point at the directories above)."""
    return share_dir() / "ansible.cfg"


if __name__ == "__main__":  # `python -m fdl.resources`: where the Ansible content is, for ANSIBLE_CONFIG
    print(share_dir())
