"""Real-code-path fakes for hardware this machine lacks, built at test time.

- `build_fake_nvml(dest)`: compiles fake_nvml.c into dest/libnvidia-ml.so.1.
  The real pynvml loads it when dest is on LD_LIBRARY_PATH (set before the
  process starts); `FakeNvml.env(...)` gives that environment, with the devices
  scripted through FDL_FAKE_NVML (syntax at the top of fake_nvml.c).
- `build_fake_nccl(dest, "2.27.5")`: a libnccl.so.2.27.5 (+ libnccl.so.2 link)
  whose ncclGetVersion answers that version.
- `make_libtorch(...)`: a libtorch variant tree on disk as flodl lays it out
  (lib/, .arch, build-version, optional bundled NCCL), optionally activated in
  its libtorch root's `.active`.
- `make_host_root(...)`: the slice of a host's file system the stack checks
  read (`proc/modules`, `dev/nvidia*`), for FDL_PROBE_ROOT. Device nodes are
  symlinks to /dev/null (a real character device anyone may open) unless a
  test asks for them missing, as plain files, or root-only (real nodes, made
  with mknod: root only).

pytest fixtures over these live in tests/conftest.py (`fake_nvml`, `fake_nccl`).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

FAKES = Path(__file__).resolve().parent
NVML_SONAME = "libnvidia-ml.so.1"
NCCL_SONAME = "libnccl.so.2"


class FakeBuildError(RuntimeError):
    """gcc is missing or refused a fake's source."""


def _compile(source: Path, output: Path, soname: str, defines: dict[str, str] | None = None) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FakeBuildError("gcc is needed to build the test fakes (listed in scripts/apt-test.txt)")
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [gcc, "-shared", "-fPIC", "-O1", "-Wall", f"-Wl,-soname,{soname}", "-o", str(output), str(source)]
    command[1:1] = [f"-D{key}={value}" for key, value in (defines or {}).items()]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise FakeBuildError(f"gcc failed on {source.name}:\n{done.stderr}")
    return output


def build_fake_nvml(dest: Path) -> Path:
    """Compile the fake NVML into dest/libnvidia-ml.so.1 and return dest."""
    _compile(FAKES / "fake_nvml.c", Path(dest) / NVML_SONAME, NVML_SONAME)
    return Path(dest)


NVIDIA_MODULES = ("nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia")


def make_host_root(root: Path, *, minors: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7), nouveau: bool = False,
                   modules: bool = True,
                   missing: tuple[str, ...] = (), plain: tuple[str, ...] = (),
                   root_only: tuple[str, ...] = ()) -> Path:
    """A scripted host file system under `root` for FDL_PROBE_ROOT; returns root.

    Nodes are named as under /dev ("nvidia0", "nvidiactl", "nvidia-uvm").
    `missing` leaves them out, `plain` makes them regular files, `root_only`
    makes them real character devices (1,3, like /dev/null) with mode 0600,
    which needs root. `modules=False` leaves /proc/modules out (unreadable).
    """
    root = Path(root)
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "proc").mkdir(exist_ok=True)
    if modules:
        names = (["nouveau"] if nouveau else []) + list(NVIDIA_MODULES) + ["ext4", "veth"]
        (root / "proc" / "modules").write_text(
            "".join(f"{name} 16384 0 - Live 0x0000000000000000\n" for name in names))
    for node in ["nvidiactl", "nvidia-uvm", *(f"nvidia{m}" for m in minors)]:
        path = root / "dev" / node
        if path.is_symlink() or path.exists():
            path.unlink()
        if node in missing:
            continue
        if node in plain:
            path.write_bytes(b"")
        elif node in root_only:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
            os.chmod(path, 0o600)
        else:
            path.symlink_to("/dev/null")
    return root


@dataclass(frozen=True)
class FakeNvml:
    """A built fake NVML: `env()` is what an fdl subprocess needs to see it."""

    lib_dir: Path
    host_root: Path | None = None  # a healthy host file system the stack checks read; None: built beside lib_dir

    def env(self, devices: str | None = "", *, driver: str | None = None, cuda: int | None = None,
            extra_lib_dirs: tuple[str, ...] = (), root: Path | str | None = None) -> dict[str, str]:
        """Environment for a process whose NVML reports `devices` (FDL_FAKE_NVML syntax).

        devices=None leaves the library off LD_LIBRARY_PATH entirely: NVML is missing.
        `root` is the FDL_PROBE_ROOT (default: this fake's healthy host_root).
        """
        lib_dirs = [*extra_lib_dirs]
        if devices is not None:
            lib_dirs.insert(0, str(self.lib_dir))
        env = {"LD_LIBRARY_PATH": os.pathsep.join(lib_dirs), "FDL_FAKE_NVML": devices or "",
               "FDL_PROBE_ROOT": str(root if root is not None else self.default_root())}
        if driver is not None:
            env["FDL_FAKE_NVML_DRIVER"] = driver
        if cuda is not None:
            env["FDL_FAKE_NVML_CUDA"] = str(cuda)
        return env

    def default_root(self) -> Path:
        """The healthy host root: host_root, or one made (once) next to the library, as readable as it is."""
        if self.host_root is not None:
            return self.host_root
        root = self.lib_dir.parent / f"{self.lib_dir.name}-host-root"
        if not (root / "proc" / "modules").exists():
            make_host_root(root)
        return root


def nccl_version_code(version: str) -> int:
    """NCCL's integer encoding (NCCL_VERSION_CODE): 2.27.5 -> 22705."""
    major, minor, patch = (int(p) for p in version.split("."))
    return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch


def build_fake_nccl(dest: Path, version: str = "2.27.5", *, reported: str | None = None) -> Path:
    """A loadable libnccl.so.<version> in dest with the libnccl.so.2 link; returns the link.

    `reported` makes ncclGetVersion answer a different version than the file
    name says (to tell which of the two a reader believed).
    """
    dest = Path(dest)
    real = _compile(FAKES / "fake_nccl.c", dest / f"libnccl.so.{version}", NCCL_SONAME,
                    {"FAKE_NCCL_VERSION_CODE": str(nccl_version_code(reported or version))})
    link = dest / NCCL_SONAME
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(real.name)
    return link


def make_libtorch(root: Path, variant: str = "precompiled/cu128", *, torch: str | None = "2.10.0",
                  cuda: str | None = "12.8", archs: str | None = "7.0 7.5 8.0 8.6 8.9 9.0 12.0",
                  build_version: str | None = None, arch_file: bool = True, activate: bool = True,
                  nccl: str | None = None, nccl_loadable: bool = True) -> Path:
    """Lay out a libtorch variant under `root` (a libtorch root); return the variant directory.

    variant "" makes `root` itself the variant directory (an unpacked libtorch
    zip). `.arch` carries torch=, cuda= (none for CPU), archs=, variant=;
    `build-version` (e.g. "2.10.0+cu128") is written when given. nccl="2.27.5"
    bundles lib/libnccl.so.2 (a real loadable fake, or with nccl_loadable=False
    an empty file that only its name can date; nccl="2" with nccl_loadable=False:
    an undatable bare libnccl.so.2).
    """
    root = Path(root)
    vdir = root / variant if variant else root
    (vdir / "lib").mkdir(parents=True, exist_ok=True)
    (vdir / "lib" / "libtorch.so").write_bytes(b"")
    (vdir / "include").mkdir(exist_ok=True)
    if arch_file:
        lines = []
        if cuda is not None:
            lines.append(f"cuda={cuda}")
        if torch is not None:
            lines.append(f"torch={torch}")
        if archs is not None:
            lines.append(f"archs={archs}")
        lines.append(f"source={variant.split('/')[0] if variant else 'precompiled'}")
        if variant:
            lines.append(f"variant={variant.split('/')[-1]}")
        (vdir / ".arch").write_text("\n".join(lines) + "\n")
    if build_version is not None:
        (vdir / "build-version").write_text(build_version + "\n")
    if nccl is not None:
        if nccl_loadable:
            build_fake_nccl(vdir / "lib", nccl)
        elif "." not in nccl:  # just libnccl.so.2: neither the library nor its name can date it
            (vdir / "lib" / NCCL_SONAME).write_bytes(b"")
        else:
            real = vdir / "lib" / f"libnccl.so.{nccl}"
            real.write_bytes(b"")
            (vdir / "lib" / NCCL_SONAME).symlink_to(real.name)
    if activate and variant:
        (root / ".active").write_text(variant + "\n")
    return vdir
