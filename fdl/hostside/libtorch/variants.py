"""What a libtorch variant is: its names, its kind (CPU, CUDA, ROCm), its compiled arch list, and the record
every caller shares (`Libtorch`).

Host-side (fdl/hostside/): the probe runs it on every host; the rest of fdl/libtorch/ builds on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the two directories of a libtorch root that hold variants: precompiled/<name> (downloaded) and builds/<name>
VARIANT_GROUPS = ("precompiled", "builds")

#: every variant fdl downloads, by the name PyTorch gives it (the `+suffix` of its build-version), and the
#: directory it installs to under a libtorch root. Which of them the pinned PyTorch release publishes is
#: fdl.libtorch.source's business; a mirror may serve any of them.
DOWNLOADS: dict[str, str] = {
    "cpu": "precompiled/cpu",
    "cu126": "precompiled/cu126",
    "cu128": "precompiled/cu128",
    "cu130": "precompiled/cu130",
    "rocm7.0": "precompiled/rocm70",
    "rocm7.1": "precompiled/rocm71",
    "rocm7.2": "precompiled/rocm72",
}
#: what `fdl libtorch download` and `fdl join --libtorch` accept: a download name, or auto (picked for the box)
CHOICES = ("auto",) + tuple(DOWNLOADS)

KINDS = ("cpu", "cuda", "rocm")
_VENDORS = {"cuda": "nvidia", "rocm": "amd"}
_FEATURES = {"nvidia": "cuda", "amd": "rocm"}
_VARIANT_RE = re.compile(r"^(cpu|cu\d{3}|rocm\d+(\.\d+)?)$")
_KIND_RES = (("cpu", re.compile(r"^cpu")), ("cuda", re.compile(r"^(cu|sm)\d")),
             ("rocm", re.compile(r"^(rocm|gfx|hip)\d")))
_ARCH_RE = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


def is_variant_name(text: str | None) -> bool:
    """Whether text is a variant as PyTorch names one: cpu, cuXYZ, rocmX.Y (or rocmXY, a directory's spelling)."""
    return bool(text) and _VARIANT_RE.match(text or "") is not None


def kind_of(name: str | None) -> str | None:
    """The kind ("cpu", "cuda", "rocm") a variant or directory name says, or None when it says nothing.

    The one classifier: `cpu*` is CPU-only; `cu<N>` and `sm<N>` (a build's arch range, builds/sm61-sm120)
    are CUDA; `rocm<N>`, `gfx<N>` and `hip<N>` are ROCm. A label's last part is what counts
    (precompiled/cu128 -> cu128).
    """
    if not name:
        return None
    base = name.rstrip("/").rsplit("/", 1)[-1].lower()
    for kind, pattern in _KIND_RES:
        if pattern.match(base):
            return kind
    return None


def label_of(name: str) -> str:
    """The directory a name means under a libtorch root: a download name's label (cu128 -> precompiled/cu128),
    else the name itself (precompiled/cu128, builds/sm86)."""
    return DOWNLOADS.get(name, name).strip("/")


def download_name(label: str) -> str | None:
    """The download name whose label this is (precompiled/rocm71 -> rocm7.1), or None."""
    return next((name for name, known in DOWNLOADS.items() if known == label.strip("/")), None)


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


# ---- the record ----

@dataclass
class Libtorch:
    """A libtorch variant directory (it holds lib/) and what is recorded about it: the one record the probe,
    `fdl libtorch`, the publish gate, the launcher's builds and `fdl join` pass around."""

    path: str
    source: str  # where it was found: "--libtorch-path", "LIBTORCH", "LIBTORCH_PATH", "project", "home",
    # "pytorch", or who installed it ("fdl join")
    active: str | None = None  # its path inside its libtorch root, e.g. "precompiled/cu128"
    version: str | None = None  # "2.13.0"
    variant: str | None = None  # cpu, cu128, rocm7.2 ... (None: nothing records it)
    cuda: str | None = None  # "12.8"
    archs: list[str] | None = None  # normalised: "8.6", "9.0+PTX", "9.0a"; [] for CPU; None when unrecorded
    sha256: str | None = None  # of the archive fdl downloaded it from (its install record), when fdl did
    metadata: list[str] = field(default_factory=list)  # the files the above came from

    @property
    def kind(self) -> str | None:
        """cpu, cuda or rocm: from the recorded variant, else from the directory's name; None: unknown."""
        return kind_of(self.variant) or kind_of(self.active) or kind_of(Path(self.path).name)

    @property
    def vendor(self) -> str | None:
        """The GPU vendor builds against it target: "nvidia", "amd", or None for a CPU build.

        A build nothing classifies is taken as NVIDIA's, the usual hand-built libtorch (the probe warns that
        its variant is unrecorded)."""
        kind = self.kind
        return None if kind == "cpu" else _VENDORS.get(kind or "cuda")

    @property
    def feature(self) -> str:
        """FDL_GPU_FEATURE for a build against it: "cuda", "rocm", or "" for CPU."""
        return _FEATURES.get(self.vendor or "", "")

    @property
    def label(self) -> str:
        """How messages name it: its variant path in its root (precompiled/cu128), else its directory."""
        return self.active or self.path

    def to_data(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "active": self.active, "version": self.version,
                "variant": self.variant, "kind": self.kind, "cuda": self.cuda, "archs": self.archs,
                "sha256": self.sha256, "metadata": self.metadata}
