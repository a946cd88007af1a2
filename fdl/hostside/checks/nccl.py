"""The NCCL check: which libnccl.so.2 ranks would load, and its version.

Search order: a libnccl named in LD_PRELOAD (how a cluster worker pins a
source-built NCCL), the libtorch variant's own lib/, the directories of
LD_LIBRARY_PATH, then the system's library directories (/etc/ld.so.conf and
the defaults). The version comes from calling the library's `ncclGetVersion`
through ctypes; when it cannot be loaded, from the versioned file name the
link resolves to (libnccl.so.2.27.5).

With `docker=SERVICE` NCCL comes from that compose service's image instead:
the check asks `docker compose config --services` whether the service exists
and does not look at the host's NCCL. (This machine's tests run it against a
stand-in `docker` script: no Docker engine or compose plugin exists there.)

Host-side (fdl/hostside/: runs in fdl and on managed hosts): standard library only, relative imports.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from .report import ERROR, OK, SKIPPED, WARNING, CheckResult

if TYPE_CHECKING:
    from ..libtorch.variants import Libtorch

NAME = "nccl"
SONAME = "libnccl.so.2"
DEFAULT_LIB_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/local/lib")
_FILE_VERSION_RE = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)$")
DOCKER_TIMEOUT_S = 60


@dataclass
class NcclLibrary:
    path: str  # as found (often the libnccl.so.2 link)
    real_path: str  # what the link resolves to
    origin: str  # LD_PRELOAD, libtorch, LD_LIBRARY_PATH or system
    version: str | None = None
    version_source: str | None = None  # ncclGetVersion or filename

    def to_data(self) -> dict[str, Any]:
        return {"path": self.path, "real_path": self.real_path, "origin": self.origin, "version": self.version,
                "version_source": self.version_source}


def decode_version(code: int) -> str:
    """NCCL_VERSION_CODE as text: 22705 -> 2.27.5 (codes below 10000 are the pre-2.9 encoding)."""
    if code >= 10000:
        return f"{code // 10000}.{(code % 10000) // 100}.{code % 100}"
    return f"{code // 1000}.{(code % 1000) // 100}.{code % 100}"


def library_version(path: str) -> tuple[str | None, str | None]:
    """(version, how it was learnt): ncclGetVersion through ctypes, else the resolved file name."""
    try:
        import ctypes

        library = ctypes.CDLL(path)
        code = ctypes.c_int(0)
        if library.ncclGetVersion(ctypes.byref(code)) == 0 and code.value > 0:
            return decode_version(code.value), "ncclGetVersion"
    except (OSError, AttributeError):
        pass
    match = _FILE_VERSION_RE.search(os.path.basename(os.path.realpath(path)))
    if match:
        return match[1], "filename"
    return None, None


def _ld_so_conf_dirs(conf: str = "/etc/ld.so.conf", depth: int = 0) -> list[str]:
    dirs: list[str] = []
    try:
        with open(conf, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return dirs
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include") and depth < 4:
            pattern = line.split(None, 1)[1] if " " in line else ""
            if pattern and not pattern.startswith("/"):
                pattern = os.path.join(os.path.dirname(conf), pattern)
            for included in sorted(glob.glob(pattern)):
                dirs.extend(_ld_so_conf_dirs(included, depth + 1))
        elif line.startswith("/"):
            dirs.append(line)
    return dirs


def system_lib_dirs() -> list[str]:
    multiarch = glob.glob("/usr/lib/*-linux-gnu") + glob.glob("/lib/*-linux-gnu")
    seen: list[str] = []
    for directory in [*_ld_so_conf_dirs(), *multiarch, *DEFAULT_LIB_DIRS]:
        if directory not in seen:
            seen.append(directory)
    return seen


def find_nccl(libtorch_dir: str | None, environ: Mapping[str, str]) -> NcclLibrary | None:
    """The libnccl ranks would load, in the module docstring's order; None when there is none."""
    for entry in re.split(r"[:\s]+", environ.get("LD_PRELOAD", "")):
        if "libnccl" in os.path.basename(entry) and os.path.isfile(entry):
            return _found(entry, "LD_PRELOAD")
    candidates: list[tuple[str, str]] = []
    if libtorch_dir:
        candidates.append((os.path.join(libtorch_dir, "lib"), "libtorch"))
    candidates += [(d, "LD_LIBRARY_PATH") for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    candidates += [(d, "system") for d in system_lib_dirs()]
    for directory, origin in candidates:
        path = os.path.join(directory, SONAME)
        if os.path.isfile(path):
            return _found(path, origin)
        versioned = sorted(glob.glob(os.path.join(glob.escape(directory), SONAME + ".*")))
        if versioned:
            return _found(versioned[-1], origin)
    return None


def _found(path: str, origin: str) -> NcclLibrary:
    return NcclLibrary(path=path, real_path=os.path.realpath(path), origin=origin)


def check_docker_service(service: str, project_root: str | None = None,
                         environ: Mapping[str, str] | None = None) -> CheckResult:
    """NCCL from a compose service's image: the service must exist (`docker compose config --services`)."""
    environ = os.environ if environ is None else environ
    data: dict[str, Any] = {"docker_service": service, "project_root": project_root}
    docker = shutil.which("docker", path=environ.get("PATH", os.defpath))
    hint_install = ("install Docker with the compose plugin (docker compose version should answer), or drop "
                    "--docker to check the host's own NCCL")
    if docker is None:
        return CheckResult(NAME, ERROR, f"--docker {service}: NCCL is to come from a Docker image, but the "
                           f"docker command is not installed (not on PATH).", hint=hint_install, data=data)
    data["docker"] = docker
    try:
        # ansible-bad-function (a module should call run_command): this check runs the same under `fdl probe`,
        # where there is no AnsibleModule, and it needs a timeout, which run_command lacks.
        done = subprocess.run(  # pylint: disable=ansible-bad-function
            [docker, "compose", "config", "--services"], cwd=project_root or None, env=dict(environ),
            capture_output=True, text=True, timeout=DOCKER_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return CheckResult(NAME, ERROR, f"--docker {service}: `docker compose config --services` did not answer "
                           f"within {DOCKER_TIMEOUT_S} s.", hint="run it yourself to see what it waits for",
                           data=data)
    except OSError as exc:
        return CheckResult(NAME, ERROR, f"--docker {service}: cannot run {docker}: {exc.strerror}.",
                           hint=hint_install, data=data)
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[:400]
        return CheckResult(NAME, ERROR, f"--docker {service}: `docker compose config --services` failed "
                           f"(exit {done.returncode}): {said or 'no output'}",
                           hint="run it in the project directory; a missing compose file or a docker without "
                                "the compose plugin are the usual causes", data=data)
    services = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    data["services"] = services
    if service not in services:
        return CheckResult(NAME, ERROR, f"--docker {service}: the compose project has no service named "
                           f"{service!r} (it has: {', '.join(services) or 'none'}).",
                           hint="name one of its services with --docker", data=data)
    return CheckResult(NAME, OK, f"NCCL comes from the image of compose service {service!r}; the host's NCCL "
                       f"is not checked.", data=data)


def check_nccl(libtorch: Libtorch | None = None, docker: str | None = None, project_root: str | None = None,
               environ: Mapping[str, str] | None = None) -> tuple[CheckResult, NcclLibrary | None]:
    """Run the NCCL check for the resolved libtorch (or None); return (CheckResult, NcclLibrary or None)."""
    environ = os.environ if environ is None else environ
    if docker:
        return check_docker_service(docker, project_root, environ), None
    kind = libtorch.kind if libtorch is not None else None
    if kind == "rocm":
        return CheckResult(NAME, SKIPPED, "A ROCm libtorch uses RCCL, which it carries in its own lib/; NCCL is "
                           "not needed.", data={"libtorch_kind": kind}), None
    library = find_nccl(libtorch.path if libtorch is not None else None, environ)
    if library is None:
        data = {"libtorch_kind": kind}
        if libtorch is not None and kind == "cuda":
            return CheckResult(NAME, ERROR, f"No libnccl.so.2 found for the CUDA libtorch ({libtorch.variant}): "
                               "multi-GPU and multi-host training need NCCL.",
                               hint="install NCCL (Debian/Ubuntu: libnccl2 from NVIDIA's CUDA repository), "
                                    "build one with `fdl nccl build` and put it in LD_PRELOAD, or use "
                                    "--docker SERVICE when NCCL comes from a container image", data=data), None
        why = "a CPU libtorch needs none" if kind == "cpu" else "no GPU libtorch was resolved to need one"
        return CheckResult(NAME, SKIPPED, f"No libnccl.so.2 found; {why}.", data=data), None
    library.version, library.version_source = library_version(library.path)
    data = library.to_data()
    data["libtorch_kind"] = kind
    where = f"{library.real_path} (from {library.origin})"
    if library.version is None:
        return CheckResult(NAME, WARNING, f"NCCL found at {where}, but its version cannot be read.",
                           hint="NCCL versions must match across hosts (major.minor); install a versioned "
                                "libnccl.so.2.X.Y or one that exports ncclGetVersion", data=data), library
    return CheckResult(NAME, OK, f"NCCL {library.version} at {where}.", data=data), library
