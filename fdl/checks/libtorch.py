"""The libtorch check: which libtorch ranks would link, its version, variant and GPU coverage.

Resolution, first match wins (an explicit location that is broken is an error,
never a fall-through):

1. the `libtorch_path` option (`--libtorch-path`);
2. the LIBTORCH, then LIBTORCH_PATH environment variables;
3. the project's `libtorch/` tree (its active variant);
4. `~/.flodl/libtorch` (when it holds a variant or an `.active` pointer);
5. the PyTorch installed in the Python environment fdl runs in: a torch
   wheel carries a complete libtorch under `torch/lib` (with `torch/include`).
   It is found without importing torch (the probe stays fast) and described
   from `torch/version.py` (`__version__`, `cuda`, `hip`). Last, because an
   environment's PyTorch is incidental: a variant installed for flodl wins.
   `FDL_LIBTORCH_FROM_PYTORCH=0` leaves it out.

Each location may be a variant directory (it holds `lib/`), a libtorch root
(holding `.active` and `precompiled/<variant>` / `builds/<name>`), or a pointer
file `.active*` inside a root. What a variant is comes from its `.arch` file
(`torch=`, `cuda=`, `archs=`, `variant=` lines, written by flodl when it
installs or builds a variant), else from PyTorch's own `build-version` file
("2.10.0+cu128"), else from the directory name. docs/probe.md has the details.

Standard library only; sibling imports relative (Ansible module_utils).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from .report import ERROR, OK, WARNING, CheckResult

if TYPE_CHECKING:
    from .gpu import Selection
    from .nvml import NvmlInventory

NAME = "libtorch"
VARIANT_GROUPS = ("precompiled", "builds")
_VARIANT_RE = re.compile(r"^(cpu|cu\d{3}|rocm\d+(\.\d+)?)$")
_ARCH_RE = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")
DOWNLOAD_HINT = ("install a variant (fdl libtorch download auto, or --cpu), point --libtorch-path or LIBTORCH at "
                 "an unpacked libtorch, or activate an installed one (fdl libtorch activate VARIANT)")


class LibtorchNotFound(Exception):
    """No usable libtorch at the location that was asked for (or anywhere, for the search)."""

    def __init__(self, message: str, hint: str, tried: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.tried = tried or []


@dataclass
class Libtorch:
    """A resolved libtorch variant directory and what is recorded about it."""

    path: str
    source: str  # "--libtorch-path", "LIBTORCH", "LIBTORCH_PATH", "project", "home" or "pytorch"
    active: str | None = None  # the variant's path inside its libtorch root, e.g. "precompiled/cu128"
    version: str | None = None
    variant: str | None = None  # cpu, cu128, rocm7.0 ...
    cuda: str | None = None  # "12.8"
    archs: list[str] | None = None  # normalised: "8.6", "9.0+PTX", "9.0a"; [] for CPU; None when unrecorded
    metadata: list[str] = field(default_factory=list)  # the files the above came from

    @property
    def kind(self) -> str | None:
        if self.variant is None:
            return None
        if self.variant == "cpu":
            return "cpu"
        return "rocm" if self.variant.startswith("rocm") else "cuda"

    def to_data(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "active": self.active, "version": self.version,
                "variant": self.variant, "kind": self.kind, "cuda": self.cuda, "archs": self.archs,
                "metadata": self.metadata}


# ---- arch lists ----

def normalise_arch(token: str) -> str | None:
    """One arch entry in any common spelling ("8.6", "sm_86", "86", "compute_90", "9.0+PTX") as "8.6"."""
    text = token.strip()
    if not text:
        return None
    ptx = False
    if text.lower().startswith("compute_"):
        ptx, text = True, text[len("compute_"):]
    elif text.lower().startswith("sm_"):
        text = text[3:]
    elif text.lower().startswith("sm") and text[2:3].isdigit():
        text = text[2:]
    if text.upper().endswith("+PTX"):
        ptx, text = True, text[:-4]
    suffix = ""
    if text[-1:] in ("a", "f"):
        suffix, text = text[-1], text[:-1]
    if re.fullmatch(r"\d+\.\d+", text):
        major, minor = text.split(".")
    elif re.fullmatch(r"\d{2,3}", text):
        major, minor = text[:-1], text[-1]
    else:
        return None
    return f"{int(major)}.{int(minor)}{suffix}{'+PTX' if ptx else ''}"


def parse_archs(text: str) -> list[str]:
    """An arch list ("7.0 8.6 9.0+PTX", "7.0;8.6", "sm_70,sm_86"); "cpu" or "none" is the empty list."""
    tokens = [t for t in re.split(r"[\s;,]+", text.strip()) if t]
    if [t.lower() for t in tokens] in (["cpu"], ["none"]):
        return []
    return [a for a in (normalise_arch(t) for t in tokens) if a is not None]


def arch_covers(archs: list[str], major: int, minor: int) -> bool:
    """Whether a build with these archs runs on a GPU of compute capability major.minor.

    CUDA's rules: a cubin for X.y runs on X.z with z >= y (same major); PTX
    (+PTX, compute_XY) is compiled on the fly for any newer GPU; arch-specific
    builds (9.0a, 10.0f) run only on exactly that GPU.
    """
    for arch in archs:
        match = _ARCH_RE.match(arch)
        if not match:
            continue
        a_major, a_minor, suffix, ptx = int(match[1]), int(match[2]), match[3], match[4]
        if suffix:
            if (a_major, a_minor) == (major, minor):
                return True
        elif (ptx and (a_major, a_minor) <= (major, minor)) or (a_major == major and a_minor <= minor):
            return True
    return False


# ---- resolution ----

def python_torch_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The `torch` package directory of this Python environment when it holds lib/, found without importing it.

    None when there is no torch, or when FDL_LIBTORCH_FROM_PYTORCH=0.
    """
    environ = os.environ if environ is None else environ
    if (environ.get("FDL_LIBTORCH_FROM_PYTORCH") or "").strip() == "0":
        return None
    try:
        spec = importlib.util.find_spec("torch")  # locates the package; runs none of its code
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "lib").is_dir():
            return str(location)
    return None


def read_torch_version(torch_dir: Path) -> dict[str, str | None]:
    """`__version__`, `cuda` and `hip` from a torch package's version.py, read as text (never imported)."""
    found: dict[str, str | None] = {}
    try:
        tree = ast.parse((torch_dir / "version.py").read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return found
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        for target in targets:
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and \
                    (value.value is None or isinstance(value.value, str)):
                found[target.id] = value.value
    return found


def _pytorch(torch_dir: Path) -> Libtorch:
    info = Libtorch(path=str(torch_dir), source="pytorch", active=None)
    values = read_torch_version(torch_dir)
    if values:
        info.metadata.append("torch/version.py")
    version, _sep, suffix = (values.get("__version__") or "").partition("+")
    info.version = version or None
    cuda, hip = values.get("cuda"), values.get("hip")
    if cuda:
        info.cuda = cuda
        info.variant = "cu" + cuda.replace(".", "")[:3]
    elif hip:
        info.variant = "rocm" + ".".join(hip.split(".")[:2])
    elif suffix == "cpu" or values:
        info.variant = "cpu"
    if suffix and _VARIANT_RE.match(suffix):
        info.variant = suffix
    if info.kind == "cpu":
        info.archs = []
    return info


def resolve_libtorch(explicit: str | None, environ: Mapping[str, str], project_root: str | None, home: str | None,
                     pytorch: str | None = None) -> Libtorch:
    """Find the libtorch ranks would use (rules in the module docstring); raise LibtorchNotFound.

    `pytorch` is the environment's torch package directory (python_torch_dir()), the last resort.
    """
    if explicit:
        return _at(Path(explicit).expanduser(), "--libtorch-path")
    for var in ("LIBTORCH", "LIBTORCH_PATH"):
        value = environ.get(var)
        if value:
            return _at(Path(value).expanduser(), var)
    tried: list[str] = []
    if project_root:
        root = Path(project_root) / "libtorch"
        if root.is_dir():
            return _from_root(root, "project")
        tried.append(str(root))
    if home:
        home_root = Path(home) / ".flodl" / "libtorch"
        if home_root.exists() and (pytorch is None or (home_root / "lib").is_dir() or
                                   (home_root / ".active").exists() or installed_variants(home_root)):
            return _at(home_root, "home")
        tried.append(str(home_root))
    if pytorch and (Path(pytorch) / "lib").is_dir():
        return _pytorch(Path(pytorch))
    tried_text = ", ".join(tried) if tried else "no project or home directory to look in"
    raise LibtorchNotFound(f"No libtorch found: --libtorch-path, LIBTORCH and LIBTORCH_PATH are unset, "
                           f"there is none at {tried_text}, and this Python environment has no PyTorch.",
                           DOWNLOAD_HINT, tried)


def _at(path: Path, source: str) -> Libtorch:
    label = f"{source} {path}" if source.startswith("--") else f"{source}={path}" if source.isupper() else str(path)
    if not path.exists():
        raise LibtorchNotFound(f"libtorch not found: {label} does not exist.",
                               "correct the path, or unset it to let fdl search the project and ~/.flodl")
    if path.is_file():
        if path.name.startswith(".active"):
            return _from_pointer(path, path.parent, source)
        raise LibtorchNotFound(f"libtorch not found: {label} is a file, not a libtorch directory.",
                               "point it at the directory holding lib/ (or at a libtorch root with .active)")
    if (path / "lib").is_dir():
        return _variant(path, source, None)
    if (path / ".active").exists() or any((path / group).is_dir() for group in VARIANT_GROUPS):
        return _from_root(path, source)
    raise LibtorchNotFound(f"libtorch not found: {label} has no lib/ directory.",
                           "point it at an unpacked libtorch (the directory holding lib/libtorch.so)")


def _from_pointer(pointer: Path, root: Path, source: str) -> Libtorch:
    try:
        active = pointer.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as exc:
        raise LibtorchNotFound(f"Cannot read the libtorch pointer {pointer}: {exc.strerror}.",
                               "fix its permissions") from None
    if not active:
        raise LibtorchNotFound(f"The libtorch pointer {pointer} is empty.",
                               f"write the active variant's path (e.g. precompiled/cu128) into {pointer}")
    vdir = root / active
    if not (vdir / "lib").is_dir():
        installed = installed_variants(root)
        raise LibtorchNotFound(
            f"{pointer} names variant {active!r}, but {vdir} holds no lib/ directory.",
            f"install it, or point {pointer.name} at an installed variant"
            + (f" ({', '.join(installed)})" if installed else ""))
    return _variant(vdir, source, active)


def installed_variants(root: Path) -> list[str]:
    """Variants under a libtorch root: precompiled/<name> and builds/<name> directories holding lib/."""
    found: list[str] = []
    for group in VARIANT_GROUPS:
        try:
            entries = sorted(p for p in (root / group).iterdir() if (p / "lib").is_dir())
        except OSError:
            continue
        found.extend(f"{group}/{p.name}" for p in entries)
    return found


def _from_root(root: Path, source: str) -> Libtorch:
    pointer = root / ".active"
    if pointer.exists():
        return _from_pointer(pointer, root, source)
    installed = installed_variants(root)
    if len(installed) == 1:
        return _variant(root / installed[0], source, installed[0])
    if not installed:
        raise LibtorchNotFound(f"{root} holds no libtorch variant (nothing under precompiled/ or builds/).",
                               DOWNLOAD_HINT)
    raise LibtorchNotFound(f"{root} holds several variants ({', '.join(installed)}) and no .active file says "
                           f"which one is in use.",
                           f"write the one to use (e.g. {installed[0]}) into {pointer}")


def read_key_values(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    return values


def _variant(vdir: Path, source: str, active: str | None) -> Libtorch:
    info = Libtorch(path=str(vdir), source=source, active=active)
    arch: dict[str, str] = {}
    arch_file = vdir / ".arch"
    if arch_file.is_file():
        try:
            arch = read_key_values(arch_file)
            info.metadata.append(".arch")
        except OSError:
            arch = {}
    build_version = None
    build_file = vdir / "build-version"
    if build_file.is_file():
        try:
            build_version = build_file.read_text(encoding="utf-8", errors="replace").strip() or None
            info.metadata.append("build-version")
        except OSError:
            build_version = None
    version, _plus, suffix = (build_version or "").partition("+")

    info.version = arch.get("torch") or version or None
    cuda = arch.get("cuda")
    if cuda and cuda.lower() not in ("none", "cpu", ""):
        info.cuda = cuda
    variant = arch.get("variant")
    if not (variant and _VARIANT_RE.match(variant)):
        variant = None
        if suffix and _VARIANT_RE.match(suffix):
            variant = suffix
        elif cuda is not None:
            variant = "cpu" if cuda.lower() in ("none", "cpu") else "cu" + cuda.replace(".", "")
        elif _VARIANT_RE.match(vdir.name):
            variant = vdir.name
    info.variant = variant
    if info.cuda is None and variant and variant.startswith("cu") and len(variant) == 5:
        info.cuda = f"{int(variant[2:4])}.{variant[4]}"
    if "archs" in arch:
        info.archs = parse_archs(arch["archs"])
    elif info.kind == "cpu":
        info.archs = []
    return info


def describe_variant(vdir: Path, source: str, active: str | None) -> Libtorch:
    """What is recorded about the variant directory vdir (.arch, build-version, its name)."""
    return _variant(vdir, source, active)


def describe_pytorch(torch_dir: Path) -> Libtorch:
    """The libtorch a torch package directory carries, described from its version.py."""
    return _pytorch(torch_dir)


# ---- the check ----

def check_libtorch(libtorch_path: str | None = None, environ: Mapping[str, str] | None = None,
                   project_root: str | None = None, home: str | None = None, inventory: NvmlInventory | None = None,
                   selection: Selection | None = None) -> tuple[CheckResult, Libtorch | None]:
    """Run the libtorch check against the GPUs the GPU check found; return (CheckResult, Libtorch or None)."""
    environ = os.environ if environ is None else environ
    if home is None:
        home = environ.get("HOME") or os.path.expanduser("~")
    try:
        info = resolve_libtorch(libtorch_path, environ, project_root, home, python_torch_dir(environ))
    except LibtorchNotFound as exc:
        return CheckResult(NAME, ERROR, exc.message, hint=exc.hint, data={"tried": exc.tried}), None

    data = info.to_data()
    devices = list(inventory.devices) if inventory is not None else []
    if selection is not None and selection.indices is not None:
        devices = [d for d in devices if d.index in selection.indices]
    label = " ".join(filter(None, [info.version or "(version unrecorded)", info.variant]))
    where = f"{info.path} (from {info.source})"
    summary = f"libtorch {label} at {where}."
    problems: list[tuple[str, str, str | None]] = []  # (status, sentence, hint)

    if info.kind is None:
        problems.append((WARNING, "Its variant (cpu, cuXYZ or rocmX.Y) is not recorded, so its GPU support "
                         "cannot be checked.", "add an .arch file with cuda= and archs= lines (docs/probe.md)"))
    elif info.kind == "cpu" and devices:
        problems.append((WARNING, f"This is a CPU build, so training will not use the {len(devices)} GPU"
                         f"{'s' if len(devices) != 1 else ''} here.",
                         "install and activate a CUDA variant (fdl libtorch download)"))
    elif info.kind == "rocm" and devices:
        problems.append((ERROR, "This is a ROCm (AMD) build, but this host's GPUs are NVIDIA.",
                         "install and activate a CUDA variant (fdl libtorch download)"))
    elif info.kind == "cuda" and devices:
        if info.archs is None:
            problems.append((WARNING, "Its compiled arch list is not recorded, so GPU coverage cannot be "
                             "checked.", "add an archs= line to the variant's .arch file (docs/probe.md)"))
        else:
            missed = [d for d in devices if not arch_covers(info.archs, d.major, d.minor)]
            data["uncovered_devices"] = [d.index for d in missed]
            if missed:
                names = ", ".join(f"GPU {d.index} ({d.name}, {d.sm})" for d in missed)
                problems.append((ERROR, f"{names} {'is' if len(missed) == 1 else 'are'} not covered by this "
                                 f"build's arch list ({' '.join(info.archs) or 'empty'}); kernels would fail "
                                 f"to load there.",
                                 "use a variant compiled for "
                                 + ", ".join(sorted({f"{d.major}.{d.minor}" for d in missed}))
                                 + " (a libtorch built from source with those archs under builds/, activated "
                                   "with fdl libtorch activate, or a precompiled variant that lists them)"))
        # the driver's CUDA version against this build's is the cuda_driver check (stack.py)

    if not problems:
        covered = ""
        if info.kind == "cuda" and devices and info.archs:
            covered = f" Its archs ({' '.join(info.archs)}) cover every selected GPU."
        return CheckResult(NAME, OK, summary + covered, data=data), info
    status = ERROR if any(p[0] == ERROR for p in problems) else WARNING
    message = " ".join([summary] + [p[1] for p in problems])
    hint = "; ".join(p[2] for p in problems if p[2])
    return CheckResult(NAME, status, message, hint=hint or None, data=data), info
