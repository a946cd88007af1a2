"""Where a libtorch download comes from: PyTorch's own download location for the pinned release, or a mirror.

With no configuration fdl fetches PyTorch's published libtorch for Linux, release PYTORCH_RELEASE, from
OFFICIAL_BASE in PyTorch's own naming (since release 2.8 the Linux archives carry no `cxx11-abi` in their
names; they are built with the C++11 ABI):

    https://download.pytorch.org/libtorch/<variant>/libtorch-shared-with-deps-<release>%2B<variant>.zip

A mirror (`--mirror`, else FDL_LIBTORCH_MIRROR, else `mirror:` in the `libtorch:` block, else
`libtorch_mirror:` in the `join:` block) is a base URL laid out either way:

    <mirror>/libtorch-<variant>.zip + <mirror>/libtorch-<variant>.zip.sha256     fdl's naming (any release)
    <mirror>/<variant>/libtorch-shared-with-deps-<release>%2B<variant>.zip      PyTorch's (the pinned release),
                                                                               an optional .sha256 beside it

PyTorch publishes no checksums for these archives, so a pin is the fleet's own: `sha256:` per variant in the
`libtorch:` block, or a mirror's `.sha256` file. docs/cli.md has the whole story.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from ..config.parse import mirror_problem
from ..errors import ConfigError, FdlError, UsageError
from ..hostside.envvars import FDL_LIBTORCH_MIRROR
from ..hostside.libtorch.variants import DOWNLOADS

#: the PyTorch release fdl downloads by default (the project's torch pin), and the variants it publishes as
#: libtorch archives for Linux
PYTORCH_RELEASE = "2.13.0"
OFFICIAL_BASE = "https://download.pytorch.org/libtorch"
OFFICIAL_VARIANTS = ("cpu", "cu126", "cu130", "rocm7.2")


class Source(NamedTuple):
    """Where variants come from, and the SHA-256 pins the configuration holds for them."""

    mirror: str | None = None  # a base URL; None: PyTorch's own download location
    given_by: str = "default"  # "--mirror", FDL_LIBTORCH_MIRROR, "libtorch.mirror", "join.libtorch_mirror"
    pins: tuple[tuple[str, str], ...] = ()  # (variant, sha256) from `libtorch: sha256:`

    @property
    def official(self) -> bool:
        return self.mirror is None

    @property
    def base(self) -> str:
        return OFFICIAL_BASE if self.mirror is None else self.mirror.rstrip("/")

    def pin(self, variant: str) -> str | None:
        return dict(self.pins).get(variant)

    def describe(self) -> str:
        if self.mirror is None:
            return f"PyTorch's download location ({OFFICIAL_BASE}, release {PYTORCH_RELEASE})"
        return f"the mirror {self.mirror} (from {self.given_by})"


def official_file(variant: str, release: str = PYTORCH_RELEASE) -> str:
    """PyTorch's name for a Linux libtorch archive of a release (as a file; a URL spells '+' as %2B)."""
    return f"libtorch-shared-with-deps-{release}+{variant}.zip"


def official_url(variant: str, base: str = OFFICIAL_BASE) -> str:
    """The URL of a variant in PyTorch's layout under base (PyTorch's own, or a mirror copying it)."""
    return f"{base.rstrip('/')}/{variant}/{official_file(variant).replace('+', '%2B')}"


def fdl_file(variant: str) -> str:
    """fdl's name for a variant's archive on a mirror (its checksum is this plus .sha256)."""
    return f"libtorch-{variant}.zip"


def choose_source(flag: str | None = None, environ: Mapping[str, str] | None = None,
                  configured: str | None = None, join_mirror: str | None = None,
                  pins: tuple[tuple[str, str], ...] = (), *, configured_by: str = "libtorch.mirror") -> Source:
    """The source a download uses: --mirror, else FDL_LIBTORCH_MIRROR, else the libtorch: block's mirror:,
    else the join: block's libtorch_mirror:, else PyTorch's own location. A mirror naming PyTorch's own
    location is that location.

    A bad URL on the command line is a UsageError (exit 2); anywhere else a ConfigError (exit 1).
    """
    environ = os.environ if environ is None else environ
    candidates: list[tuple[str, str | None, type[FdlError]]] = [
        ("--mirror", flag, UsageError),
        (FDL_LIBTORCH_MIRROR, environ.get(FDL_LIBTORCH_MIRROR), ConfigError),
        (configured_by, configured, ConfigError),
        ("join.libtorch_mirror", join_mirror, ConfigError),
    ]
    for given_by, value, error in candidates:
        url = (value or "").strip()
        if not url:
            continue
        problem = mirror_problem(url)
        if problem is not None:
            raise error(f"the libtorch mirror from {given_by}: {problem}.",
                        hint=f"Fix {given_by}, or leave it unset to download from {OFFICIAL_BASE}.")
        if url.rstrip("/") == OFFICIAL_BASE:
            return Source(None, given_by, pins)
        return Source(url.rstrip("/"), given_by, pins)
    return Source(None, "default", pins)


def check_served(variant: str, source: Source) -> None:
    """Refuse a variant the source cannot have: PyTorch's location publishes OFFICIAL_VARIANTS only (UsageError:
    the request and the configuration contradict each other)."""
    if variant not in DOWNLOADS:
        raise UsageError(f"libtorch variant {variant!r} is not one fdl downloads ({', '.join(DOWNLOADS)}).")
    if source.official and variant not in OFFICIAL_VARIANTS:
        raise UsageError(
            f"PyTorch {PYTORCH_RELEASE} publishes no {variant} libtorch (it publishes "
            f"{', '.join(OFFICIAL_VARIANTS)}).",
            hint=f"Pick one of those, or serve {variant} from a mirror (--mirror URL, {FDL_LIBTORCH_MIRROR}, or "
                 f"mirror: in the libtorch: block of fdl.yml; docs/cli.md shows the layout).")


def route_auto(vendor: str | None, capabilities: tuple[tuple[int, int], ...] = ()) -> str:
    """The variant `auto` picks for what a box offers: cpu for CPU ranks, rocm7.2 for AMD GPUs, and for
    NVIDIA cu130, or cu126 when a GPU is older than compute capability 7.5 (CUDA 13 dropped those)."""
    if vendor is None:
        return "cpu"
    if vendor == "amd":
        return "rocm7.2"
    old = [cap for cap in capabilities if cap < (7, 5)]
    new = [cap for cap in capabilities if cap >= (10, 0)]
    if old and new:
        listing = ", ".join(f"sm_{a}{b}" for a, b in capabilities)
        raise UsageError(
            f"libtorch auto: no precompiled libtorch serves every GPU offered here ({listing}): cu126 is the "
            f"last build for GPUs older than sm_75, and sm_100+ needs CUDA 12.8 or newer.",
            hint="Offer one generation with --devices, or build libtorch for both archs (builds/sm61-sm120) and "
                 "point LIBTORCH_PATH at it.")
    return "cu126" if old else "cu130"
