"""Ship fdl's check library to remote hosts as Ansible module_utils, without copying it.

Ansible bundles into a module's AnsiballZ payload whatever the module imports
as `ansible.module_utils.X`, looked up in the module_utils directories it is
given. fdl gives it one directory, made at run time in the cache:

    <cache>/module_utils/<key>/
        fdl_checks -> <installed fdl>/checks     (a symlink: the very files local commands import)
        pynvml.py  -> <this environment's pynvml.py>

so the probe module imports `ansible.module_utils.fdl_checks.probe` and a
target needs neither fdl nor pynvml installed. fdl/checks imports only the
standard library, its siblings (relatively) and pynvml, which keeps it
bundleable.

Standard library only; nothing here imports Ansible.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

CHECKS_PACKAGE = "fdl_checks"


def cache_dir() -> Path:
    """fdl's cache directory: $XDG_CACHE_HOME/fdl, else ~/.cache/fdl."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fdl"


def checks_dir() -> Path:
    """The installed fdl/checks package directory."""
    return Path(__file__).resolve().parent.parent / "checks"


def pynvml_file() -> Path | None:
    """The pynvml.py of the running environment (found, not imported); None when not installed."""
    spec = importlib.util.find_spec("pynvml")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).resolve()


def module_utils_dir() -> Path:
    """The module_utils directory for this fdl and this environment, created on first use.

    Its name is a hash of the two link targets, so an upgrade or another
    environment gets its own directory and a finished one is never rewritten.
    """
    links = {CHECKS_PACKAGE: checks_dir()}
    nvml = pynvml_file()
    if nvml is not None:
        links["pynvml.py"] = nvml
    key = hashlib.sha256("\0".join(f"{k}={v}" for k, v in sorted(links.items())).encode()).hexdigest()[:16]
    target = cache_dir() / "module_utils" / key
    if _complete(target, links):
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    for name, source in links.items():
        os.symlink(source, staging / name)
    try:
        os.rename(staging, target)
    except OSError:  # another fdl finished the same directory first: use theirs
        for name in links:
            (staging / name).unlink()
        staging.rmdir()
        if not _complete(target, links):
            raise
    return target


def _complete(target: Path, links: dict[str, Path]) -> bool:
    try:
        return all(os.readlink(target / name) == str(source) for name, source in links.items())
    except OSError:
        return False


def register_with_ansible() -> Path:
    """Add the directory to the running Ansible's module_utils search path (inventory plugin use)."""
    from ansible.plugins.loader import module_utils_loader  # noqa: PLC0415 - only inside Ansible

    path = module_utils_dir()
    module_utils_loader.add_directory(str(path))
    return path


if __name__ == "__main__":  # `python -m fdl.cluster.modutils`: print the directory (for ANSIBLE_MODULE_UTILS)
    print(module_utils_dir())
