"""Where the plan's inputs come from when the user does not name them.

- The NCCL tag: under a cluster env, the newest NCCL the cluster's hosts report
  through the cluster probe (fdl.nccl.fleet), built for the host with the older
  one (choose_target); otherwise, or when no host reports one, the newest NCCL
  bundled with this project's libtorch variants (libtorch/{precompiled,builds}/<name>/lib/).
- The archs: the compute capabilities of this host's GPUs, through NVML.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fdl.nccl.plan import Arch, NcclVersion, PlanError, archs_from_capabilities, parse_archs

_VERSION_RE = re.compile(r"^(2)\.(\d+)\.(\d+)$")


@dataclass(frozen=True)
class BundledNccl:
    """An NCCL shipped inside a libtorch variant of the project."""

    variant: str  # e.g. precompiled/cu128
    version: NcclVersion
    path: Path


@dataclass(frozen=True)
class HostNccl:
    """The NCCL version one host reported (through the probe)."""

    host: str
    version: NcclVersion


def bundled_nccl(root: Path) -> list[BundledNccl]:
    """The NCCL libraries the project's libtorch variants carry, oldest first.

    Variants are found and NCCL is dated the way `fdl probe` does it
    (fdl.hostside.libtorch.resolve / fdl.hostside.checks.nccl): ncclGetVersion when the library
    loads, else the versioned file name.
    """
    from fdl.hostside.checks.nccl import SONAME, library_version
    from fdl.hostside.libtorch.resolve import installed_variants, project_refusal, roots
    from fdl.hostside.trust import tree_refusal

    project = roots(str(root), None)[0]
    libtorch = project.path
    found = []
    for variant in installed_variants(libtorch) if not project.refused else [""]:
        lib = libtorch / variant / "lib"
        refused = project.refused or tree_refusal(libtorch, lib)
        if refused:  # loading it would run another account's code as this user
            refusal = project_refusal(project._replace(refused=refused))
            raise PlanError(f"{refusal.message} ({refusal.hint})")
        candidates = [lib / SONAME] if (lib / SONAME).is_file() else sorted(lib.glob(SONAME + ".*"))
        if not candidates:
            continue
        version, _how = library_version(str(candidates[-1]))
        match = _VERSION_RE.match(version or "")
        if match:
            found.append(BundledNccl(variant, NcclVersion(*map(int, match.groups())), candidates[-1]))
    return sorted(found, key=lambda b: (b.version, b.variant))


def tag_from_bundled(bundled: list[BundledNccl], root: Path) -> tuple[NcclVersion, str]:
    """The newest bundled NCCL and a sentence saying where it was found."""
    if not bundled:
        raise PlanError(
            f"cannot tell which NCCL version to build: no libtorch variant under {root / 'libtorch'} "
            f"bundles a libnccl.so.2 whose version can be read. Name the version the rest of the "
            f"fleet runs, e.g. --tag v2.27.5 (fdl @cluster probe shows it per host)."
        )
    newest = bundled[-1]
    others = sorted({str(b.version) for b in bundled if b.version != newest.version})
    source = f"newest NCCL bundled with this project's libtorch ({newest.variant})"
    if others:
        source += f"; older ones found: {', '.join(others)}"
    return newest.version, source


@dataclass(frozen=True)
class Target:
    """What the cluster's NCCL versions decide: the version to build, why, and for which host."""

    version: NcclVersion
    source: str  # the plan's tag_source sentence
    host: str | None  # the host with the older NCCL (None: no host is behind, or --host named the host)
    notes: tuple[str, ...] = ()


def choose_target(reports: list[HostNccl], *, host: str | None, me: str) -> Target:
    """Seed 000's rig flow: build, on the host with the older NCCL, the newest NCCL the cluster runs.

    NCCL refuses a handshake across a major.minor skew, so the hosts behind the newest major.minor are the ones
    to build for. With several behind, this machine goes first when it is one of them (no ssh), else the one
    with the oldest NCCL; the rest are named. `host` (--host) keeps its build host and only takes the version.
    """
    def major_minor(version: NcclVersion) -> tuple[int, int]:
        return version.major, version.minor

    newest = max(r.version for r in reports)
    at_newest = [r.host for r in reports if r.version == newest]
    listing = ", ".join(f"{r.host} {r.version.version}" for r in reports)
    source = f"the newest NCCL the cluster runs ({newest.version} on {', '.join(at_newest)})"
    behind = [r for r in reports if major_minor(r.version) < major_minor(newest)]
    if host is not None:
        own = next((r for r in reports if r.host == host), None)
        current = own is not None and major_minor(own.version) == major_minor(newest)
        said = (f"{host} already runs NCCL {own.version.version}, the cluster's newest major.minor ({listing}): "
                f"nothing to match there; building as asked") if own is not None and current else None
        return Target(newest, source, None, (said,) if said else ())
    if not behind:
        return Target(newest, source, None, (
            f"every cluster host runs NCCL {newest.major}.{newest.minor}.x ({listing}): none is behind, so this "
            f"builds for this machine at that version",))
    order = {r.host: i for i, r in enumerate(reports)}
    mine = [r for r in behind if r.host == me]
    chosen = mine[0] if mine else min(behind, key=lambda r: (r.version, order[r.host]))
    notes: list[str] = [f"cluster NCCL versions: {listing}; {chosen.host} has the older NCCL "
                        f"({chosen.version.version}), so this builds NCCL {newest.version} for {chosen.host}"]
    others = [r for r in behind if r is not chosen]
    if others:
        names = ", ".join(f"{r.host} ({r.version.version})" for r in others)
        notes.append(f"also behind: {names}; build for each with `fdl @cluster nccl build --host NAME`")
    return Target(newest, f"{source}, for {chosen.host}, whose NCCL {chosen.version.version} is older",
                  chosen.host, tuple(notes))


def choose_tag(explicit: str | None, *, root: Path) -> tuple[NcclVersion, str]:
    """--tag wins; then the project's libtorch (the cluster's versions are choose_target's)."""
    if explicit is not None:
        return NcclVersion.parse(explicit), "--tag"
    return tag_from_bundled(bundled_nccl(root), root)


def local_capabilities() -> list[tuple[int, int]] | None:
    """This host's GPUs through NVML (None when NVML is unavailable)."""
    from fdl.hostside.checks.nvml import device_capabilities

    return device_capabilities()


def choose_archs(explicit: str | None, *, detect: Callable[[], list[tuple[int, int]] | None] = local_capabilities,
                 where: str = "this host") -> tuple[tuple[Arch, ...], str]:
    """--archs wins; otherwise the GPUs `detect` reports (NVML on this host by default)."""
    if explicit is not None:
        return parse_archs(explicit), "--archs"
    capabilities = detect()
    archs = archs_from_capabilities(capabilities, where=where)
    listing = ", ".join(f"GPU{i} {major}.{minor}" for i, (major, minor) in enumerate(capabilities or []))
    return archs, f"detected on {where} through NVML ({listing})"
