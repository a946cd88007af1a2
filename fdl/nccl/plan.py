"""The NCCL source-build plan: what `fdl nccl build` will do, decided before anything runs.

Pure: parsing and validating the tag and the GPU archs, mapping archs to
`NVCC_GENCODE` flags, and naming every path and docker command. Detection
(NVML, the libtorch scan, the fleet) lives elsewhere and feeds in here; the
role `fdl_nccl` receives the result as variables and acts on it.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from fdl.errors import FdlError

# Parallel compile jobs (seed 000, docs/nccl.md): each of NCCL's nvcc jobs takes gigabytes of memory, so the
# default is a number a workstation survives, not the CPU count; --jobs raises it on a big build host.
DEFAULT_JOBS = 6
MAX_JOBS = 256
# CUDA 12.9 compiles for every arch from 5.0 (Maxwell) to 12.1; CUDA 13 dropped
# offline compilation below 7.5, and heterogeneous rigs are often exactly a Pascal
# box next to a Blackwell one.
DEFAULT_BASE_IMAGE = "nvidia/cuda:12.9.1-devel-ubuntu22.04"
NCCL_REPO_URL = "https://github.com/NVIDIA/nccl.git"
SRC_DIR = "/opt/nccl"  # where the Dockerfile clones NCCL; its build lands in SRC_DIR/build/lib
DOCKERFILE_NAME = "Dockerfile.nccl.source"
BUILD_MINUTES = (5, 15)
CONTAINER = "<container>"  # stands for the id `docker create` prints

# Compute capabilities NVIDIA has shipped that a CUDA 12 toolchain can target.
KNOWN_ARCHS = ((5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 7),
               (8, 9), (9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1))
MIN_ARCH = (5, 0)

_TAG_RE = re.compile(r"^v?(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?:-(\d{1,3}))?$")
_ARCH_DOTTED_RE = re.compile(r"^(\d{1,2})\.(\d)$")
_ARCH_SM_RE = re.compile(r"^(?:sm_?|compute_)?(\d{1,2})(\d)$")


class PlanError(FdlError):
    """The build cannot be planned: a bad tag, a bad arch, nothing to detect from."""


@dataclass(frozen=True, order=True)
class NcclVersion:
    """An NCCL release: 2.27.5, cloned from the git tag v2.27.5-1."""

    major: int
    minor: int
    patch: int
    release: int = 1

    @classmethod
    def parse(cls, text: str, *, what: str = "--tag") -> NcclVersion:
        match = _TAG_RE.match(text.strip())
        if not match:
            raise PlanError(
                f"{what} {text!r} is not an NCCL release tag. Give it as vMAJOR.MINOR.PATCH, e.g. v2.27.5 "
                f"(NCCL's own git tag, v2.27.5-1, works too); the releases are listed at "
                f"https://github.com/NVIDIA/nccl/tags."
            )
        major, minor, patch, release = match.groups()
        if int(major) != 2:
            raise PlanError(
                f"{what} {text!r}: NCCL releases are 2.x (the library is libnccl.so.2); give one like v2.27.5."
            )
        return cls(int(major), int(minor), int(patch), int(release) if release is not None else 1)

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def git_ref(self) -> str:
        """The tag to clone: NCCL tags every release with a build suffix (v2.27.5-1)."""
        return f"v{self.version}-{self.release}"

    def __str__(self) -> str:
        return f"v{self.version}"


@dataclass(frozen=True, order=True)
class Arch:
    """A CUDA compute capability, e.g. 6.1 (Pascal) or 12.0 (Blackwell)."""

    major: int
    minor: int

    @property
    def dotted(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def number(self) -> str:
        return f"{self.major}{self.minor}"

    @property
    def sm(self) -> str:
        return f"sm{self.number}"

    def __str__(self) -> str:
        return self.dotted


def parse_archs(text: str) -> tuple[Arch, ...]:
    """`--archs "6.1;12.0"` (also `,` or spaces; `sm_61` and `61` forms) -> sorted, unique archs."""
    words = [word for word in re.split(r"[;,\s]+", text.strip()) if word]
    if not words:
        raise PlanError(
            f"--archs {text!r} names no architecture. List compute capabilities separated by ';', "
            f"e.g. --archs \"6.1;12.0\", or leave --archs out to use this host's GPUs."
        )
    archs = set()
    for word in words:
        match = _ARCH_DOTTED_RE.match(word) or _ARCH_SM_RE.match(word.lower())
        pair = (int(match.group(1)), int(match.group(2))) if match else None
        if pair not in KNOWN_ARCHS:
            if pair is not None and pair < MIN_ARCH:
                why = (f"{word!r} reads as compute capability {pair[0]}.{pair[1]}, older than anything the "
                       f"CUDA 12 toolchain in the build image can target (5.0 and newer)")
                if word.isdigit():
                    why += f"; write {word}.0 if you meant compute capability {word}.0"
            else:
                why = f"{word!r} is not a CUDA compute capability"
            raise PlanError(
                f"--archs {text!r}: {why}. Known ones: {', '.join(f'{a}.{b}' for a, b in KNOWN_ARCHS)} "
                f"(nvidia-smi --query-gpu=compute_cap --format=csv prints a GPU's own); or leave --archs "
                f"out to use this host's GPUs."
            )
        archs.add(Arch(*pair))
    return tuple(sorted(archs))


def archs_from_capabilities(capabilities: list[tuple[int, int]] | None, *,
                            where: str = "this host") -> tuple[Arch, ...]:
    """The archs of the GPUs NVML reported (None: NVML unavailable); refuses when there are none."""
    if capabilities is None:
        raise PlanError(
            f"cannot detect the GPU architectures of {where}: NVML (libnvidia-ml.so.1, part of the NVIDIA "
            f"driver) is not available or failed. Name them yourself, e.g. --archs \"6.1;12.0\"."
        )
    if not capabilities:
        raise PlanError(
            f"{where} has no GPUs that NVML can see, so there is no architecture to build for. Name them "
            f"yourself, e.g. --archs \"6.1;12.0\" for the GPUs of the host that will use the library."
        )
    archs = set()
    for major, minor in capabilities:
        if (major, minor) < MIN_ARCH:
            raise PlanError(
                f"a GPU of {where} has compute capability {major}.{minor}, older than anything the CUDA 12 "
                f"toolchain can target (5.0 and newer); NCCL cannot be built for it."
            )
        archs.add(Arch(int(major), int(minor)))
    return tuple(sorted(archs))


def gencode_flags(archs: tuple[Arch, ...]) -> list[str]:
    """`-gencode` flags: SASS for every arch, plus PTX of the newest so newer GPUs can JIT it."""
    flags = [f"-gencode=arch=compute_{a.number},code=sm_{a.number}" for a in archs]
    newest = max(archs)
    flags.append(f"-gencode=arch=compute_{newest.number},code=compute_{newest.number}")
    return flags


def arch_label(archs: tuple[Arch, ...]) -> str:
    """`sm61-sm120`: the archs as they appear in the output directory name."""
    return "-".join(a.sm for a in archs)


def parse_jobs(value: int) -> int:
    if not 1 <= value <= MAX_JOBS:
        raise PlanError(f"--jobs {value}: give a number of parallel compile jobs from 1 to {MAX_JOBS}.")
    return value


@dataclass(frozen=True)
class BuildPlan:
    """Everything one NCCL build needs, named up front (paths are on the build host)."""

    nccl: NcclVersion
    archs: tuple[Arch, ...]
    root: str  # project root on the build host; may start with ~ on a remote host
    host: str = "localhost"  # inventory name of the build host
    remote: bool = False
    jobs: int = DEFAULT_JOBS
    base_image: str = DEFAULT_BASE_IMAGE
    repo_url: str = NCCL_REPO_URL
    tag_source: str = ""
    archs_source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return f"{self.nccl}-{arch_label(self.archs)}"

    @property
    def gencode(self) -> list[str]:
        return gencode_flags(self.archs)

    @property
    def builds_dir(self) -> str:
        return posixpath.join(self.root, "libtorch", "nccl", "builds")

    @property
    def output_dir(self) -> str:
        return posixpath.join(self.builds_dir, self.name)

    @property
    def library(self) -> str:
        return posixpath.join(self.output_dir, "lib", "libnccl.so.2")

    @property
    def context_dir(self) -> str:
        return posixpath.join(self.root, "libtorch", "nccl", "context", self.name)

    @property
    def dockerfile(self) -> str:
        return posixpath.join(self.context_dir, DOCKERFILE_NAME)

    @property
    def image(self) -> str:
        return f"fdl-nccl:{self.name}"

    @property
    def staging(self) -> str:
        """Where the library is copied out first (a fresh temporary directory next to the output)."""
        return posixpath.join(self.builds_dir, f".{self.name}.partial-XXXXXX")

    def docker_commands(self, docker: str = "docker") -> dict[str, list[str]]:
        """The docker invocations, in order; the role `fdl_nccl` runs exactly these."""
        return {
            "preflight": [docker, "info", "--format", "{{.ServerVersion}}"],
            "build": [docker, "build", "--tag", self.image, "--file", self.dockerfile, self.context_dir],
            "create": [docker, "create", self.image],
            "copy": [docker, "cp", f"{CONTAINER}:{SRC_DIR}/build/lib", posixpath.join(self.staging, "lib")],
            "remove": [docker, "rm", CONTAINER],
        }

    def role_vars(self) -> dict[str, Any]:
        """The role's public variables (roles/fdl_nccl/defaults/main.yml) for this plan."""
        return {
            "fdl_nccl_tag": self.nccl.git_ref,
            "fdl_nccl_version": self.nccl.version,
            "fdl_nccl_archs": [a.dotted for a in self.archs],
            "fdl_nccl_gencode": self.gencode,
            "fdl_nccl_jobs": self.jobs,
            "fdl_nccl_base_image": self.base_image,
            "fdl_nccl_repo_url": self.repo_url,
            "fdl_nccl_src_dir": SRC_DIR,
            "fdl_nccl_image": self.image,
            "fdl_nccl_context_dir": self.context_dir,
            "fdl_nccl_output_dir": self.output_dir,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "remote": self.remote,
            "tag": str(self.nccl),
            "git_ref": self.nccl.git_ref,
            "version": self.nccl.version,
            "tag_source": self.tag_source,
            "archs": [a.dotted for a in self.archs],
            "archs_label": arch_label(self.archs),
            "archs_source": self.archs_source,
            "gencode": self.gencode,
            "jobs": self.jobs,
            "base_image": self.base_image,
            "repo_url": self.repo_url,
            "root": self.root,
            "context_dir": self.context_dir,
            "dockerfile": self.dockerfile,
            "image": self.image,
            "docker_commands": self.docker_commands(),
            "output_dir": self.output_dir,
            "library": self.library,
            "estimated_minutes": list(BUILD_MINUTES),
            "role_vars": self.role_vars(),
            "notes": list(self.notes),
        }


def command_line(argv: list[str]) -> str:
    """A docker argv as a shell line a user can paste."""
    return " ".join(_container_word(word) if word.startswith(CONTAINER) else shlex.quote(word) for word in argv)


def _container_word(word: str) -> str:
    rest = word[len(CONTAINER):]
    return CONTAINER + shlex.quote(rest) if rest else CONTAINER  # quote("") is '', not nothing
