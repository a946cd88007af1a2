"""What `fdl libtorch list|info|download|activate` do: list the roots, explain the resolution, fetch and
activate a variant. The command module (fdl/cli/libtorch.py) only parses and renders."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fdl.errors import FdlError, UsageError
from fdl.hostside.libtorch.resolve import (
    LibtorchNotFound,
    describe_pytorch,
    describe_variant,
    home_of,
    home_root,
    installed_variants,
    project_refusal,
    python_torch_dir,
    read_active,
    resolution_order,
    resolve_libtorch,
    roots,
)
from fdl.hostside.libtorch.variants import CHOICES, VARIANT_GROUPS, Libtorch, download_name, label_of
from fdl.libtorch.install import Installed, Progress, ensure_variant, write_active
from fdl.libtorch.source import OFFICIAL_VARIANTS, Source, route_auto

if TYPE_CHECKING:
    from fdl.offer import Offer

Note = Callable[[str], None]


class LibtorchUsageError(UsageError):
    """A libtorch variant name that does not parse (exit 2, like any command line that does not)."""


class LibtorchMissing(FdlError):
    """The variant asked for is not installed (downloading it mends that)."""


class Listed(NamedTuple):
    """One row of `fdl libtorch list`: a variant, the root holding it, and whether that root's .active names it."""

    libtorch: Libtorch
    root: str | None  # None for the environment's PyTorch
    active: bool

    def to_data(self) -> dict[str, Any]:
        data = self.libtorch.to_data()
        data.update(scope=self.libtorch.source, root=self.root, label=self.libtorch.active or "torch",
                    active_in_root=self.active)
        return data


class Resolution(NamedTuple):
    """What the probe would resolve, and why (`fdl libtorch info`)."""

    libtorch: Libtorch | None
    error: str | None
    hint: str | None
    order: list[str]  # the resolution order, one sentence per step

    def to_data(self) -> dict[str, Any]:
        return {"libtorch": self.libtorch.to_data() if self.libtorch else None, "error": self.error,
                "hint": self.hint, "order": self.order}


def list_variants(project_root: str | None, environ: Mapping[str, str]) -> list[Listed]:
    """Every variant under the project's and the user's libtorch roots, then the environment's PyTorch."""
    found: list[Listed] = []
    for root in roots(project_root, home_of(environ)):
        if root.refused:  # another account's to fill: nothing is read from it (resolve() says why)
            continue
        active = read_active(root.path)
        for label in installed_variants(root.path):
            found.append(Listed(describe_variant(root.path / label, root.scope, label), str(root.path),
                                label == active))
    torch_dir = python_torch_dir(environ)
    if torch_dir:
        found.append(Listed(describe_pytorch(Path(torch_dir)), None, False))
    return found


def resolve(project_root: str | None, environ: Mapping[str, str], explicit: str | None = None) -> Resolution:
    """The probe's resolution (fdl.hostside.libtorch.resolve), with the order it walked."""
    home = home_of(environ)
    torch_dir = python_torch_dir(environ)
    order = resolution_order(explicit, environ, project_root, home, torch_dir)
    try:
        found = resolve_libtorch(explicit, environ, project_root, home, torch_dir)
    except LibtorchNotFound as exc:
        return Resolution(None, exc.message, exc.hint, order)
    return Resolution(found, None, None, order)


def choose_variant(name: str, offer_fn: Callable[[], Offer] | None = None) -> str:
    """A download name (cpu, cu126, cu130, rocm7.2, ... or auto) as the variant to fetch."""
    if name not in CHOICES:
        raise LibtorchUsageError(f"fdl downloads the libtorch variants {', '.join(CHOICES)}; "
                                 f"{name!r} is not one of them.",
                                 hint="Pick one of those (auto picks for this box's GPUs).")
    if name != "auto":
        return name
    offer = offer_fn() if offer_fn is not None else this_box_offer()
    return route_auto(offer.vendor, offer.capabilities)


def this_box_offer() -> Offer:
    """What this box offers for `auto`: every GPU present, else CPU ranks."""
    from fdl.hostside.checks.devices import Devices
    from fdl.offer import Offer, check_gpu_stack

    try:
        return check_gpu_stack(Devices())
    except FdlError:  # no GPU stack here: a CPU box
        return Offer(devices=Devices(kind="cpu", count=1), summary="no GPU")


def download(variant: str, *, source: Source, environ: Mapping[str, str], note: Note = lambda _: None,
             progress: Progress | None = None) -> tuple[Installed, bool]:
    """Install `variant` under the user's root; returns (installed, activated).

    It is activated when the root had no active variant yet (a first install is the one to use); otherwise
    `.active` is left alone and the caller says how to switch.
    """
    first = read_active(home_root(home_of(environ))) is None
    installed = ensure_variant(variant, source=source, environ=environ, note=note, progress=progress,
                               activate=first)
    return installed, first


def activate(name: str, project_root: str | None, environ: Mapping[str, str]) -> Listed:
    """Point the `.active` of the root holding `name` at it (the project's root first).

    `name` is a label (precompiled/cu128, builds/sm86) or a download name (cu128 = precompiled/cu128).
    """
    label = label_of(name)
    if not label or ".." in label.split("/") or label.startswith("."):
        raise LibtorchUsageError(f"{name!r} is not a libtorch variant name.",
                                 hint="Use a name `fdl libtorch list` shows (e.g. precompiled/cpu or cpu).")
    found = roots(project_root, home_of(environ))
    for root in found:
        if root.refused:
            refusal = project_refusal(root)
            raise LibtorchMissing(refusal.message, hint=refusal.hint)
    if "/" not in label:
        label = next((f"{group}/{label}" for root in found for group in VARIANT_GROUPS
                      if (root.path / group / label / "lib").is_dir()), label)
    for root in found:
        if (root.path / label / "lib").is_dir():
            write_active(root.path, label)
            return Listed(describe_variant(root.path / label, root.scope, label), str(root.path), True)
    have = [f"{row.libtorch.active} ({row.libtorch.source})" for row in list_variants(project_root, environ)
            if row.root is not None]
    known = download_name(label)
    raise LibtorchMissing(
        f"libtorch variant {label} is not installed in {' or '.join(str(r.path) for r in found)}"
        + (f"; installed: {', '.join(have)}." if have else "; no variant is installed."),
        hint=(f"Download it first: fdl libtorch download {known}" if known else
              f"Download one (fdl libtorch download auto, or one of {', '.join(OFFICIAL_VARIANTS)}), unpack a "
              f"libtorch there (the directory holding lib/), or pick an installed one (fdl libtorch list)."))
