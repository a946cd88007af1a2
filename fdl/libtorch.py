"""The `fdl libtorch` family: which libtorch variants this box has, fetching and activating one.

Two libtorch roots hold variants (`precompiled/<name>`, `builds/<name>`, each
a directory with `lib/`), each with an `.active` file naming the one in use:
the project's `libtorch/` and the user's `~/.flodl/libtorch/`. Downloads go
to the user's root, through the same code `fdl join --libtorch` uses (mirror,
SHA-256 check, atomic install: fdl.agent.libtorch). What the probe and the
publish gate resolve is fdl.checks.libtorch's resolution, which this module
only reports on; the PyTorch of this Python environment is listed as the
last-resort source it is there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fdl.agent.libtorch import Installed, Progress, ensure_variant, libtorch_root, route_auto, write_active
from fdl.agent.options import LIBTORCH_CHOICES, LIBTORCH_VARIANTS
from fdl.checks import libtorch as checks
from fdl.errors import FdlError, PermanentError

if TYPE_CHECKING:
    from fdl.agent.gpu import Offer

Note = Callable[[str], None]


class LibtorchUsageError(FdlError):
    """A libtorch variant name or location that fdl cannot act on (a fix on the command line mends it)."""


@dataclass
class Variant:
    """One installed libtorch variant (or the environment's PyTorch) and what is recorded about it."""

    scope: str  # "project" | "home" | "pytorch"
    root: str | None  # the libtorch root it lives in (None for pytorch)
    label: str  # precompiled/cu128, builds/sm86, or "torch" for pytorch
    active: bool  # the root's .active names it
    info: checks.Libtorch

    def to_data(self) -> dict[str, Any]:
        data = self.info.to_data()
        data.update(scope=self.scope, root=self.root, label=self.label, active_in_root=self.active)
        return data


def roots(project_root: str | None, environ: Mapping[str, str] | None = None) -> list[tuple[str, Path]]:
    """(scope, libtorch root) in the probe's order: the project's first, then the user's."""
    out = []
    if project_root:
        out.append(("project", Path(project_root) / "libtorch"))
    out.append(("home", libtorch_root(environ)))
    return out


def _active_label(root: Path) -> str | None:
    try:
        return (root / ".active").read_text(encoding="utf-8", errors="replace").strip() or None
    except OSError:
        return None


def list_variants(project_root: str | None, environ: Mapping[str, str] | None = None) -> list[Variant]:
    """Every variant under the project's and the user's libtorch roots, then the environment's PyTorch."""
    environ = os.environ if environ is None else environ
    found: list[Variant] = []
    for scope, root in roots(project_root, environ):
        active = _active_label(root)
        for label in checks.installed_variants(root):
            info = checks.describe_variant(root / label, scope, label)
            found.append(Variant(scope=scope, root=str(root), label=label, active=label == active, info=info))
    torch_dir = checks.python_torch_dir(environ)
    if torch_dir:
        found.append(Variant(scope="pytorch", root=None, label="torch", active=False,
                             info=checks.describe_pytorch(Path(torch_dir))))
    return found


@dataclass
class Resolution:
    """What the probe would resolve, and why."""

    libtorch: checks.Libtorch | None
    error: str | None
    hint: str | None
    order: list[str]  # the resolution order, one sentence per step

    def to_data(self) -> dict[str, Any]:
        return {"libtorch": self.libtorch.to_data() if self.libtorch else None, "error": self.error,
                "hint": self.hint, "order": self.order}


def resolve(project_root: str | None, environ: Mapping[str, str] | None = None,
            explicit: str | None = None) -> Resolution:
    """The probe's resolution (fdl.checks.libtorch), with the order it walked."""
    environ = os.environ if environ is None else environ
    home = environ.get("HOME") or os.path.expanduser("~")
    torch_dir = checks.python_torch_dir(environ)
    order = [
        f"--libtorch-path: {explicit or 'not given'}",
        f"LIBTORCH: {environ.get('LIBTORCH') or 'unset'}",
        f"LIBTORCH_PATH: {environ.get('LIBTORCH_PATH') or 'unset'}",
        f"the project's libtorch/: {Path(project_root) / 'libtorch' if project_root else 'no project'}",
        f"the user's libtorch root: {Path(home) / '.flodl' / 'libtorch'}",
        f"this Python environment's PyTorch: {torch_dir or 'none (or FDL_LIBTORCH_FROM_PYTORCH=0)'}",
    ]
    try:
        found = checks.resolve_libtorch(explicit, environ, project_root, home, torch_dir)
    except checks.LibtorchNotFound as exc:
        return Resolution(None, exc.message, exc.hint, order)
    return Resolution(found, None, None, order)


def choose_variant(name: str, offer_fn: Callable[[], Offer] | None = None) -> str:
    """A download name (cpu, cu126, cu128, rocm7.0, rocm7.1, auto) as the variant to fetch."""
    if name not in LIBTORCH_CHOICES:
        raise LibtorchUsageError(f"fdl downloads the libtorch variants {', '.join(LIBTORCH_CHOICES)}; "
                                 f"{name!r} is not one of them.",
                                 hint="Pick one of those (auto picks for this box's GPUs).")
    if name != "auto":
        return name
    offer = offer_fn() if offer_fn is not None else this_box_offer()
    return route_auto(offer)


def this_box_offer() -> Offer:
    """What this box offers for `auto`: every GPU present, else CPU ranks."""
    from fdl.agent.gpu import Offer, check_gpu_stack
    from fdl.config.schema import Devices

    try:
        return check_gpu_stack(Devices())
    except FdlError:  # no GPU stack here: a CPU box
        return Offer(devices=Devices(kind="cpu", count=1), summary="no GPU")


def mirror_url(flag: str | None, environ: Mapping[str, str], configured: str | None) -> str | None:
    """--mirror, else FDL_LIBTORCH_MIRROR, else `libtorch_mirror:` of the join: block."""
    return (flag or "").strip() or (environ.get("FDL_LIBTORCH_MIRROR") or "").strip() or configured or None


def download(variant: str, *, mirror: str | None, environ: Mapping[str, str] | None = None,
             note: Note = lambda _: None, progress: Progress | None = None) -> tuple[Installed, bool]:
    """Install `variant` under the user's root; returns (installed, activated).

    It is activated when the root had no active variant yet (a first install is
    the one to use); otherwise `.active` is left alone and the caller says how
    to switch.
    """
    environ = os.environ if environ is None else environ
    if not mirror:
        raise PermanentError(
            f"no libtorch mirror is configured to download {variant} from.",
            hint="Pass --mirror URL, set FDL_LIBTORCH_MIRROR, or set libtorch_mirror: in the join: block of "
                 f"fdl.yml: the base URL serving {variant and 'libtorch-' + variant + '.zip'} and its .sha256.")
    root = libtorch_root(environ)
    first = _active_label(root) is None
    installed = ensure_variant(variant, mirror=mirror, environ=environ, note=note, progress=progress,
                               activate=first)
    return installed, first


def activate(name: str, project_root: str | None, environ: Mapping[str, str] | None = None) -> Variant:
    """Point the `.active` of the root holding `name` at it (the project's root first).

    `name` is a label (precompiled/cu128, builds/sm86) or a download name (cu128 = precompiled/cu128).
    """
    environ = os.environ if environ is None else environ
    label = LIBTORCH_VARIANTS.get(name, name).strip("/")
    if not label or ".." in label.split("/") or label.startswith("."):
        raise LibtorchUsageError(f"{name!r} is not a libtorch variant name.",
                                 hint="Use a name `fdl libtorch list` shows (e.g. precompiled/cpu or cpu).")
    if "/" not in label:
        label = next((f"{group}/{label}" for _, root in roots(project_root, environ)
                      for group in checks.VARIANT_GROUPS if (root / group / label / "lib").is_dir()), label)
    for scope, root in roots(project_root, environ):
        if (root / label / "lib").is_dir():
            write_active(root, label)
            return Variant(scope=scope, root=str(root), label=label, active=True,
                           info=checks.describe_variant(root / label, scope, label))
    have = [f"{v.label} ({v.scope})" for v in list_variants(project_root, environ) if v.scope != "pytorch"]
    download_name = next((k for k, v in LIBTORCH_VARIANTS.items() if v == label), None)
    raise LibtorchUsageError(
        f"libtorch variant {label} is not installed in "
        f"{' or '.join(str(r) for _, r in roots(project_root, environ))}"
        + (f"; installed: {', '.join(have)}." if have else "; no variant is installed."),
        hint=(f"Download it first: fdl libtorch download {download_name}" if download_name else
              "Unpack a libtorch there (the directory holding lib/), or pick an installed one."))
