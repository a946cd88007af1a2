#!/usr/bin/python
"""Ansible module: move a staged NCCL build into place with one atomic rename."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fdl_nccl_install
short_description: Put a staged libnccl build in place atomically
description:
  - Checks that a staging directory holds C(lib/libnccl.so.<version>), completes the
    C(libnccl.so.2) link, writes C(fdl-nccl-build.json), syncs it all to disk and renames the
    staging directory onto O(dest) in one step. An existing O(dest) is exchanged atomically
    (renameat2 RENAME_EXCHANGE) so readers see either the old build or the new one, never a mix.
  - The staging directory must be on the same file system as O(dest); create it next to it.
options:
  staging:
    description: Directory holding C(lib/) as copied out of the build image. Not needed in check mode.
    type: path
  dest:
    description: Output directory; receives C(lib/libnccl.so.2).
    type: path
    required: true
  version:
    description: NCCL version the build must contain, e.g. C(2.27.5).
    type: str
    required: true
  manifest:
    description: Facts about the build, written to C(fdl-nccl-build.json) in O(dest).
    type: dict
    default: {}
author:
  - The fdl authors (@flodl)
"""

EXAMPLES = r"""
- name: Move the staged build into place
  flodl.fdl.fdl_nccl_install:
    staging: /srv/flodl/libtorch/nccl/builds/.v2.27.5-sm61.partial-x1y2z3
    dest: /srv/flodl/libtorch/nccl/builds/v2.27.5-sm61
    version: 2.27.5
    manifest: {tag: v2.27.5-1, archs: ["6.1"]}
"""

RETURN = r"""
library:
  description: Absolute path of the library to preload.
  returned: always
  type: str
  sample: /srv/flodl/libtorch/nccl/builds/v2.27.5-sm61/lib/libnccl.so.2
dest:
  description: Absolute path of the output directory.
  returned: always
  type: str
replaced:
  description: Whether an earlier build at O(dest) was replaced.
  returned: always
  type: bool
"""

import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

MANIFEST = "fdl-nccl-build.json"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare(staging: str, version: str, manifest: dict) -> None:
    """Check the staged tree, complete it, and make it durable; raises ValueError naming what is wrong."""
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
    for directory, _dirs, files in os.walk(staging):
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                fsync_path(path)
        os.chmod(directory, 0o755)
        fsync_path(directory)


def exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux renameat2); False when the system cannot."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


def install(staging: str, dest: str) -> bool:
    """Rename staging onto dest; returns whether an earlier build was replaced."""
    parent = os.path.dirname(dest)
    if not os.path.lexists(dest):
        os.rename(staging, dest)
        fsync_path(parent)
        return False
    if exchange(staging, dest):
        shutil.rmtree(staging)  # now holds the earlier build
    else:
        aside = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.old-", dir=parent)
        os.rename(dest, os.path.join(aside, "build"))
        os.rename(staging, dest)
        shutil.rmtree(aside)
    fsync_path(parent)
    return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "staging": {"type": "path"},
            "dest": {"type": "path", "required": True},
            "version": {"type": "str", "required": True},
            "manifest": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    dest = os.path.abspath(module.params["dest"])
    library = os.path.join(dest, "lib", "libnccl.so.2")
    result = {"changed": True, "dest": dest, "library": library, "replaced": os.path.lexists(dest)}
    if module.check_mode:
        module.exit_json(**result)
    staging = module.params["staging"]
    if not staging:
        module.fail_json(msg="fdl_nccl_install needs staging: the directory the build was copied into", **result)
    staging = os.path.abspath(staging)
    if os.path.dirname(staging) != os.path.dirname(dest):
        module.fail_json(msg=f"staging {staging} must sit next to {dest} (same directory) for an atomic rename",
                         **result)
    try:
        prepare(staging, module.params["version"], module.params["manifest"])
        result["replaced"] = install(staging, dest)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"could not put the NCCL build in place at {dest}: {exc}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
