"""Where the Ansible content shipped with fdl lives at run time.

The content is one Ansible collection, flodl.fdl (fdl/collection.py). A built
wheel carries its complete tree inside the package, under
`fdl/_share/collections/ansible_collections/flodl/fdl/`, next to fdl's own
templates, the Packer template and ansible.cfg in `fdl/_share/`. A clone keeps
the collection's parts at the repository root (roles/, playbooks/, library/,
inventory_plugins/, collection/) and has fdl build the complete tree into its
cache on first use (keyed by fdl's version and a hash of the content).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fdl import collection

PACKAGE_DIR = Path(__file__).resolve().parent
_WHEEL_SHARE = PACKAGE_DIR / "_share"


def _installed() -> bool:
    return (_WHEEL_SHARE / "collections" / collection.RELATIVE / "galaxy.yml").is_file()


@cache
def share_dir() -> Path:
    """The directory holding templates/ (fdl's own), packer/ and ansible.cfg."""
    for candidate in (_WHEEL_SHARE, PACKAGE_DIR.parent):
        if (candidate / "templates").is_dir() and (candidate / "ansible.cfg").is_file():
            return candidate
    raise FileNotFoundError(f"fdl's shipped files (templates/, ansible.cfg) were not found next to {PACKAGE_DIR}; "
                            f"reinstall fdl")


def collections_path() -> Path:
    """The directory to give Ansible as ANSIBLE_COLLECTIONS_PATH: it holds ansible_collections/flodl/fdl."""
    if _installed():
        return _WHEEL_SHARE / "collections"
    collection.check_source(collection.REPO_ROOT)  # a clear error when a part is missing
    return collection.built_in_cache()


def collection_root() -> Path:
    """The complete, runnable collection tree Ansible uses."""
    return collections_path() / collection.RELATIVE


def playbook(name: str) -> Path:
    """Path of one of the collection's playbooks in the tree Ansible runs, e.g. playbook('probe.yml')."""
    return collection_root() / "playbooks" / name


def roles_dir() -> Path:
    """The roles as shipped (the wheel's tree, or a clone's roles/), for reading their files without a build."""
    if _installed():
        return _WHEEL_SHARE / "collections" / collection.RELATIVE / "roles"
    collection.check_source(collection.REPO_ROOT)
    return collection.REPO_ROOT / "roles"


def templates_dir() -> Path:
    """fdl's own templates (the farm's cloud-init, overlay and worker files)."""
    return share_dir() / "templates"


def ansible_cfg() -> Path:
    """The ansible.cfg fdl runs with (SSH and execution settings; no paths)."""
    return share_dir() / "ansible.cfg"


if __name__ == "__main__":  # `python -m fdl.resources`: the collections path, for ANSIBLE_COLLECTIONS_PATH
    print(collections_path())
