"""Where the plan's inputs come from when the user does not name them.

- The NCCL tag: the fleet's version. Under a cluster env that is what the
  other hosts report through the probe; otherwise the newest NCCL bundled with
  this project's libtorch variants (libtorch/{precompiled,builds}/<name>/lib/).
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


def tag_from_fleet(reports: list[HostNccl]) -> tuple[NcclVersion, str]:
    """The one NCCL version the other hosts run; refuses when they disagree."""
    versions = sorted({r.version for r in reports})
    if len(versions) > 1:
        listing = "; ".join(f"{r.host} {r.version}" for r in sorted(reports, key=lambda r: r.host))
        raise PlanError(
            f"the other hosts do not agree on an NCCL version ({listing}), so there is no single version "
            f"to match. Pick the one the fleet should run and pass it as --tag."
        )
    hosts = ", ".join(sorted(r.host for r in reports))
    return versions[0], f"the NCCL the other hosts of the cluster run ({hosts})"


def choose_tag(explicit: str | None, *, root: Path, fleet: list[HostNccl] | None) -> tuple[NcclVersion, str]:
    """--tag wins; then the fleet's version (under a cluster env); then the project's libtorch."""
    if explicit is not None:
        return NcclVersion.parse(explicit), "--tag"
    if fleet:
        return tag_from_fleet(fleet)
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
