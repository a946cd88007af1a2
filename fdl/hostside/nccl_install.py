"""Put a staged NCCL build in place on a host: the host-side half of `fdl nccl build`.

The flodl.fdl.fdl_nccl_install module runs this for the fdl_nccl role, after the role copied the build
image's `lib/` into a staging directory beside the output directory. The staged tree is checked (it holds
`lib/libnccl.so.<version>`), completed (the `libnccl.so.2` link, the `fdl-nccl-build.json` record) and put
in place by fsio.install_dir: fsynced, then exchanged with an earlier build in one step, so readers see the
old build or the new one, never a mix.
"""

import json
import os
from typing import Any, Dict, Optional

from .fsio import install_dir

MANIFEST = "fdl-nccl-build.json"


def planned(dest: str) -> Dict[str, Any]:
    """What an install at `dest` reports (also in check mode, and beside a failure)."""
    dest = os.path.abspath(dest)
    return {"changed": True, "dest": dest, "library": os.path.join(dest, "lib", "libnccl.so.2"),
            "replaced": os.path.lexists(dest)}


def prepare(staging: str, version: str, manifest: Dict[str, Any]) -> None:
    """Check the staged tree and complete it (modes, link, record); ValueError naming what is wrong."""
    lib = os.path.join(staging, "lib")
    real = os.path.join(lib, f"libnccl.so.{version}")
    if not os.path.isfile(real) or os.path.islink(real):
        present = sorted(os.listdir(lib)) if os.path.isdir(lib) else []
        raise ValueError(
            f"the build image did not produce libnccl.so.{version} (found in its build/lib: "
            f"{', '.join(present) or 'nothing'}); the tag and the version do not match, or the build failed"
        )
    soname = os.path.join(lib, "libnccl.so.2")
    if not os.path.lexists(soname):
        os.symlink(f"libnccl.so.{version}", soname)
    elif os.path.realpath(soname) != os.path.realpath(real):
        raise ValueError(f"lib/libnccl.so.2 in the build points at {os.readlink(soname)}, not libnccl.so.{version}")
    with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)
        handle.write("\n")
    for directory, _dirs, _files in os.walk(staging):
        os.chmod(directory, 0o755)


def put_in_place(staging: Optional[str], dest: str, version: str, manifest: Dict[str, Any]) -> bool:
    """Check, complete and install the staged build at `dest`; whether an earlier build was replaced.

    ValueError with the whole message (what is wrong, where) for a missing or misplaced staging directory, a
    build that does not match, and a disk that refused."""
    dest = os.path.abspath(dest)
    if not staging:
        raise ValueError("fdl_nccl_install needs staging: the directory the build was copied into")
    staging = os.path.abspath(staging)
    if os.path.dirname(staging) != os.path.dirname(dest):
        raise ValueError(f"staging {staging} must sit next to {dest} (same directory) for an atomic rename")
    try:
        prepare(staging, version, manifest)
        return install_dir(staging, dest, replace=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"could not put the NCCL build in place at {dest}: {exc}") from exc
