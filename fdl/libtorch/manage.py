"""What `fdl libtorch list|info|download|activate|remove` do: list the roots, explain the resolution, fetch,
activate and remove a variant. The command module (fdl/cli/libtorch.py) only parses and renders."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fdl.errors import FdlError, UsageError
from fdl.hostside.fsio import fsync_dir
from fdl.hostside.libtorch.resolve import (
    ACTIVE,
    LibtorchNotFound,
    Root,
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
from fdl.libtorch.install import Installed, Progress, ensure_variant, root_lock, write_active
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


def dangling_active(project_root: str | None, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(root, variant) for every root whose `.active` names a variant that is not there (deleted by hand)."""
    found = []
    for root in roots(project_root, home_of(environ)):
        active = read_active(root.path)
        if active is not None and not (root.path / active / "lib").is_dir():
            found.append((str(root.path), active))
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
             progress: Progress | None = None) -> tuple[Installed, bool, bool]:
    """Install `variant` under the user's root; returns (installed, activated, active).

    It is activated when the root had no active variant yet (a first install is the one to use); otherwise
    `.active` is left alone and the caller says how to switch, unless `active` says it already is the one.
    """
    root = home_root(home_of(environ))
    first = read_active(root) is None
    installed = ensure_variant(variant, source=source, environ=environ, note=note, progress=progress,
                               activate=first)
    return installed, first, first or read_active(root) == installed.libtorch.active


class Removed(NamedTuple):
    """What `fdl libtorch remove` did in one root."""

    label: str  # the variant named (precompiled/cu128)
    root: str
    removed: bool  # its directory was removed (False: only a dangling .active naming it was cleared)
    active_cleared: bool  # the root's .active named it and is gone
    remaining: list[str]  # the variants the root still holds

    def to_data(self) -> dict[str, Any]:
        return {"variant": self.label, "root": self.root, "path": str(Path(self.root) / self.label),
                "removed": self.removed, "active_cleared": self.active_cleared, "remaining": self.remaining}


def _refuse_untrusted(found: list[Root]) -> None:
    """Stop at a project libtorch/ that another account could have planted (fdl.hostside.trust)."""
    for root in found:
        if root.refused:
            refusal = project_refusal(root)
            raise LibtorchMissing(refusal.message, hint=refusal.hint)


def _label(name: str, found: list[Root]) -> str:
    """A variant name as the label of its directory (cpu -> precompiled/cpu); bad names are refused (exit 2)."""
    label = label_of(name)
    if not label or ".." in label.split("/") or label.startswith(".") or "/." in label:
        raise LibtorchUsageError(f"{name!r} is not a libtorch variant name.",
                                 hint="Use a name `fdl libtorch list` shows (e.g. precompiled/cpu or cpu).")
    if "/" not in label:
        label = next((f"{group}/{label}" for root in found for group in VARIANT_GROUPS
                      if (root.path / group / label / "lib").is_dir()), label)
    return label


def remove(name: str, project_root: str | None, environ: Mapping[str, str], *, force: bool = False) -> Removed:
    """Remove an installed variant from the root holding it (the project's first), in one step.

    Under the root's install lock its directory is renamed to a hidden temporary name (the variant is gone
    at once, for every reader) and then deleted; a removal killed half-way leaves only that hidden
    directory, which the next install or removal sweeps. The active variant is refused unless `force`: then
    the root's `.active` goes first, so it never names a missing variant. A `.active` that already names a
    missing variant (dangling: its directory was deleted by hand) is cleared by removing that variant.
    """
    found = roots(project_root, home_of(environ))
    _refuse_untrusted(found)
    label = _label(name, found)
    for root in found:
        vdir = root.path / label
        if not (vdir / "lib").is_dir():
            continue
        active = read_active(root.path) == label
        if active and not force:
            others = [v for v in installed_variants(root.path) if v != label]
            raise FdlError(
                f"libtorch {label} is the active variant in {root.path}; fdl leaves the active one in place "
                f"unless told to remove it.",
                hint=(f"Activate another first (fdl libtorch activate {others[0]}), or " if others else "")
                + f"remove it anyway with `fdl libtorch remove {name} --force` (its .active goes with it).")
        with root_lock(root.path):
            if active:
                (root.path / ACTIVE).unlink()
                fsync_dir(root.path)
            _remove_tree(vdir)
            remaining = installed_variants(root.path)
        return Removed(label, str(root.path), True, active, remaining)
    for root in found:
        if read_active(root.path) == label:  # dangling: it names this variant, which is not there
            with root_lock(root.path):
                with contextlib.suppress(FileNotFoundError):
                    (root.path / ACTIVE).unlink()
                fsync_dir(root.path)
                remaining = installed_variants(root.path)
            return Removed(label, str(root.path), False, True, remaining)
    have = [f"{row.libtorch.active} ({row.libtorch.source})" for row in list_variants(project_root, environ)
            if row.root is not None]
    raise LibtorchMissing(
        f"libtorch variant {label} is not installed in {' or '.join(str(r.path) for r in found)}"
        + (f"; installed: {', '.join(have)}." if have else "; no variant is installed."),
        hint="Name one `fdl libtorch list` shows.")


def _remove_tree(vdir: Path) -> None:
    """vdir gone in one rename, then deleted (a link is removed, never what it points at)."""
    # a hidden name ending in .tmp: what the install lock's sweep removes (fdl.libtorch.install._sweep)
    hidden = vdir.parent / f".{vdir.name}.removing-{secrets.token_hex(4)}.tmp"
    try:
        os.rename(vdir, hidden)
    except OSError as exc:
        raise FdlError(f"cannot remove {vdir}: {exc.strerror or exc}; it is still installed.",
                       hint=f"Fix the permissions of {vdir.parent}, then try again.") from None
    fsync_dir(vdir.parent)
    if hidden.is_symlink() or not hidden.is_dir():
        hidden.unlink()
        return
    try:
        shutil.rmtree(hidden)
    except OSError as exc:  # the variant is gone already; what is left is swept by the next install
        raise FdlError(f"{vdir} is removed, but deleting its files stopped half-way: {exc.strerror or exc} "
                       f"({hidden} is left; the next `fdl libtorch download` or remove sweeps it).") from None


def activate(name: str, project_root: str | None, environ: Mapping[str, str]) -> Listed:
    """Point the `.active` of the root holding `name` at it (the project's root first).

    `name` is a label (precompiled/cu128, builds/sm86) or a download name (cu128 = precompiled/cu128).
    """
    found = roots(project_root, home_of(environ))
    _refuse_untrusted(found)
    label = _label(name, found)
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
