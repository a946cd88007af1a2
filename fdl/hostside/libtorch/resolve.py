"""Where libtorch variants live on a box and which one ranks would link: the roots, the resolution order,
and what a variant directory records about itself.

Resolution, first match wins (an explicit location that is broken is an error, never a fall-through):

1. the `--libtorch-path` option (`explicit`);
2. the LIBTORCH, then LIBTORCH_PATH environment variables;
3. the project's `libtorch/` root;
4. the user's root, `~/.flodl/libtorch`;
5. the PyTorch installed in the Python environment fdl runs in: a torch wheel carries a complete libtorch
   under `torch/lib`, found without importing torch and described from `torch/version.py`. Last, because an
   environment's PyTorch is incidental. `FDL_LIBTORCH_FROM_PYTORCH=0` leaves it out.

The project's root (3) is another account's to fill when someone else owns it or can write it (or the
directory holding it, or any directory on the way down to a variant's `lib/`): then it is refused, naming why
and the override, and the search stops there (fdl.hostside.trust; `fdl probe` as root would otherwise load
another account's libnccl.so.2).

A root (3, 4) counts only when it holds something: a variant directory with `lib/`, or an `.active`
pointer. An empty or half-made root (a `precompiled/` with nothing complete in it) is nothing installed,
and the search goes on. Each location may be a variant directory (it holds `lib/`), a libtorch root
(`.active`, `precompiled/<variant>`, `builds/<name>`), or a pointer file `.active*` inside a root.

What a variant is comes from its `.arch` file (`torch=`, `cuda=`, `archs=`, `variant=`, `rocm=` lines,
written by flodl when it builds a variant), else PyTorch's own `build-version` ("2.13.0+cu130"), else its
directory name; fdl's install record (`.fdl-download`, written by `fdl libtorch download`) adds the SHA-256
of the archive it came from. A torch wheel's package directory (`.../site-packages/torch`, named by
--libtorch-path or LIBTORCH) is described from its `version.py`, as step 5 describes it. docs/probe.md has
the details.

Host-side (fdl/hostside/): the probe runs it on every host; the rest of fdl/libtorch/ builds on it.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path
from typing import Mapping, NamedTuple

from ..envvars import FDL_LIBTORCH_FROM_PYTORCH, read
from ..paths import LIBTORCH_IN_HOME, libtorch_root
from ..paths import home as home_dir
from ..trust import entry_refusal, override_hint, tree_refusal
from .variants import VARIANT_GROUPS, Libtorch, is_variant_name, parse_archs

#: the file in a root naming its active variant (precompiled/cu128); pointer files start with it too
ACTIVE = ".active"
#: fdl's install record in a variant it downloaded: url=, sha256=, bytes=, build=, pin= lines
RECORD = ".fdl-download"
DOWNLOAD_HINT = ("install a variant (fdl libtorch download auto, or --cpu), point --libtorch-path or LIBTORCH at "
                 "an unpacked libtorch, or activate an installed one (fdl libtorch activate VARIANT)")


class LibtorchNotFound(Exception):
    """No usable libtorch at the location that was asked for (or anywhere, for the search)."""

    def __init__(self, message: str, hint: str, tried: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.tried = tried or []


class Root(NamedTuple):
    """A directory holding libtorch variants, and which one it is."""

    scope: str  # "project" | "home"
    path: Path
    refused: str | None = None  # why fdl may not load from it (another account could have written it)


def home_root(home: str | os.PathLike[str]) -> Path:
    """The user's libtorch root under a home directory."""
    return libtorch_root(home)


def home_of(environ: Mapping[str, str] | None = None) -> str:
    """This user's home directory: $HOME, else the password database's."""
    return home_dir(environ)


def roots(project_root: str | os.PathLike[str] | None, home: str | os.PathLike[str] | None) -> list[Root]:
    """The libtorch roots, strongest first: the project's `libtorch/`, then the user's.

    The project's carries `refused` when another account owns it or can write it (project_refusal says so)."""
    found = []
    if project_root is not None and str(project_root):
        path = Path(project_root) / "libtorch"
        found.append(Root("project", path, entry_refusal(path)))
    if home is not None and str(home):
        found.append(Root("home", home_root(home)))
    return found


def read_active(root: Path) -> str | None:
    """The variant a root's `.active` names (precompiled/cu128), or None when there is none."""
    try:
        return (root / ACTIVE).read_text(encoding="utf-8", errors="replace").strip() or None
    except OSError:
        return None


def installed_variants(root: Path) -> list[str]:
    """Variants under a libtorch root: precompiled/<name> and builds/<name> directories holding lib/."""
    found: list[str] = []
    for group in VARIANT_GROUPS:
        try:
            entries = sorted(p for p in (root / group).iterdir() if not p.name.startswith(".") and
                             (p / "lib").is_dir())
        except OSError:
            continue
        found.extend(f"{group}/{p.name}" for p in entries)
    return found


def holds_libtorch(root: Path) -> bool:
    """Whether a root holds anything a search should stop at: a variant, an `.active` pointer, or lib/ itself.

    An empty root, or one holding only half-made or hidden directories (an interrupted download's), is
    nothing installed."""
    return (root / "lib").is_dir() or (root / ACTIVE).exists() or bool(installed_variants(root))


def read_key_values(path: Path) -> dict[str, str]:
    """`key=value` lines (blank lines and # comments skipped), as in `.arch` and the install record."""
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    return values


# ---- describing a variant ----

def describe_variant(vdir: Path, source: str, active: str | None = None) -> Libtorch:
    """What is recorded about the variant directory vdir (.arch, build-version, the install record, its name)."""
    info = Libtorch(path=str(vdir), source=source, active=active)
    arch = _optional_values(vdir / ".arch", info)
    build_version = None
    try:
        build_version = (vdir / "build-version").read_text(encoding="utf-8", errors="replace").strip() or None
        info.metadata.append("build-version")
    except OSError:
        pass
    record = _optional_values(vdir / RECORD, info)
    version, _plus, suffix = (build_version or "").partition("+")

    info.version = arch.get("torch") or version or None
    cuda = arch.get("cuda")
    if cuda and cuda.lower() not in ("none", "cpu", ""):
        info.cuda = cuda
    rocm = arch.get("rocm") or arch.get("hip")
    variant = arch.get("variant")
    if not is_variant_name(variant):
        variant = None
        if is_variant_name(suffix):
            variant = suffix
        elif cuda is not None:
            variant = "cpu" if cuda.lower() in ("none", "cpu", "") else "cu" + cuda.replace(".", "")
        elif rocm:
            variant = "rocm" + ".".join(rocm.split(".")[:2])
        elif is_variant_name(vdir.name):
            variant = vdir.name
    info.variant = variant
    if info.cuda is None and variant and variant.startswith("cu") and len(variant) == 5:
        info.cuda = f"{int(variant[2:4])}.{variant[4]}"
    if "archs" in arch:
        info.archs = parse_archs(arch["archs"])
    elif info.kind == "cpu":
        info.archs = []
    sha = record.get("sha256", "").lower()
    if len(sha) == 64 and all(c in "0123456789abcdef" for c in sha):
        info.sha256 = sha
    return info


def _optional_values(path: Path, info: Libtorch) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        values = read_key_values(path)
    except OSError:
        return {}
    info.metadata.append(path.name)
    return values


def python_torch_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The `torch` package directory of this Python environment when it holds lib/, found without importing it.

    None when there is no torch, or when FDL_LIBTORCH_FROM_PYTORCH=0.
    """
    if read(FDL_LIBTORCH_FROM_PYTORCH, environ).strip() == "0":
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


def is_torch_package(path: Path) -> bool:
    """Whether path is a torch wheel's package directory (torch/, with __init__.py and version.py beside lib/):
    its libtorch records itself in version.py, not in `.arch` or `build-version`."""
    return (path / "__init__.py").is_file() and (path / "version.py").is_file() and \
        not (path / ".arch").exists() and not (path / "build-version").exists()


def describe_pytorch(torch_dir: Path, source: str = "pytorch") -> Libtorch:
    """The libtorch a torch package directory carries, described from its version.py."""
    info = Libtorch(path=str(torch_dir), source=source, active=None)
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
    if is_variant_name(suffix):
        info.variant = suffix
    if info.kind == "cpu":
        info.archs = []
    return info


# ---- resolution ----

def resolution_order(explicit: str | None, environ: Mapping[str, str], project_root: str | None,
                     home: str | None, pytorch: str | None) -> list[str]:
    """The resolution order as sentences, each with what that step holds here (`fdl libtorch info`)."""
    steps = [f"--libtorch-path: {explicit or 'not given'}"]
    steps += [f"{var}: {environ.get(var) or 'unset'}" for var in ("LIBTORCH", "LIBTORCH_PATH")]
    for root in roots(project_root, home):
        what = "the project's libtorch/" if root.scope == "project" else "the user's libtorch root"
        state = f" (refused: {root.refused})" if root.refused else \
            "" if holds_libtorch(root.path) else " (nothing installed)"
        steps.append(f"{what}: {root.path}{state}")
    if not project_root:
        steps.insert(3, "the project's libtorch/: no project")
    steps.append(f"this Python environment's PyTorch: {pytorch or f'none (or {FDL_LIBTORCH_FROM_PYTORCH}=0)'}")
    return steps


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
    for root in roots(project_root, home):
        if root.refused:
            raise project_refusal(root)
        if holds_libtorch(root.path):
            return _at(root.path, root.scope, root if root.scope == "project" else None)
        tried.append(str(root.path))
    if pytorch and (Path(pytorch) / "lib").is_dir():
        return describe_pytorch(Path(pytorch))
    tried_text = ", ".join(tried) if tried else "no project or home directory to look in"
    raise LibtorchNotFound(f"No libtorch found: --libtorch-path, LIBTORCH and LIBTORCH_PATH are unset, "
                           f"nothing is installed at {tried_text}, and this Python environment has no PyTorch.",
                           DOWNLOAD_HINT, tried)


def project_refusal(root: Root) -> LibtorchNotFound:
    """The error for a project's libtorch/ that another account could have written (root.refused says how)."""
    return LibtorchNotFound(f"The project's libtorch is not loaded: {root.refused}. fdl loads no library another "
                            f"account could have put there (it would run as you), and searches no further.",
                            override_hint(root.path.parent), [str(root.path)])


def _believed(vdir: Path, project: Root | None) -> Path:
    """vdir, once every directory from the project's libtorch/ down to its lib/ is believed (nothing is read from
    the variant before that); a root of the user's own (project None) is not judged."""
    if project is not None:
        problem = tree_refusal(project.path, vdir / "lib")
        if problem:
            raise project_refusal(project._replace(refused=problem))
    return vdir


def _at(path: Path, source: str, project: Root | None = None) -> Libtorch:
    label = f"{source} {path}" if source.startswith("--") else f"{source}={path}" if source.isupper() else str(path)
    if not path.exists():
        raise LibtorchNotFound(f"libtorch not found: {label} does not exist.",
                               f"correct the path, or unset it to let fdl search the project and {LIBTORCH_IN_HOME}")
    if path.is_file():
        if path.name.startswith(ACTIVE):
            return _from_pointer(path, path.parent, source, project)
        raise LibtorchNotFound(f"libtorch not found: {label} is a file, not a libtorch directory.",
                               "point it at the directory holding lib/ (or at a libtorch root with .active)")
    if (path / "lib").is_dir():
        if is_torch_package(path):  # LIBTORCH=.../site-packages/torch: a wheel's libtorch
            return describe_pytorch(path, source)
        return describe_variant(_believed(path, project), source, None)
    if (path / ACTIVE).exists() or any((path / group).is_dir() for group in VARIANT_GROUPS):
        return _from_root(path, source, project)
    raise LibtorchNotFound(f"libtorch not found: {label} has no lib/ directory.",
                           "point it at an unpacked libtorch (the directory holding lib/libtorch.so)")


def _from_pointer(pointer: Path, root: Path, source: str, project: Root | None = None) -> Libtorch:
    if project is not None and entry_refusal(pointer):
        raise project_refusal(project._replace(refused=entry_refusal(pointer)))
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
            + (f" ({', '.join(installed)})" if installed else "")
            + f"; `fdl libtorch remove {active}` clears a pointer to a variant deleted by hand")
    return describe_variant(_believed(vdir, project), source, active)


def _from_root(root: Path, source: str, project: Root | None = None) -> Libtorch:
    pointer = root / ACTIVE
    if pointer.exists():
        return _from_pointer(pointer, root, source, project)
    installed = installed_variants(root)
    if len(installed) == 1:
        return describe_variant(_believed(root / installed[0], project), source, installed[0])
    if not installed:
        raise LibtorchNotFound(f"{root} holds no libtorch variant (nothing complete under precompiled/ or "
                               f"builds/).", DOWNLOAD_HINT)
    raise LibtorchNotFound(f"{root} holds several variants ({', '.join(installed)}) and no .active file says "
                           f"which one is in use.",
                           f"write the one to use (e.g. {installed[0]}) into {pointer}")
