"""`--source`: fetch the training tree to local disk and build it here, against this box's libtorch.

The spec parser, the fetchers, the run manifest and the recipe runner are
`fdl publish`'s own (fdl.publish); this module only decides what a worker
does with them. Everything that fails here is transient (exit 1): what is
permanent about a source (a spec that does not parse, a missing fetch tool,
a missing command of a --source-build given on this box) was decided before
the first dial (fdl.agent.permanent). What the fetched tree says is the
publisher's, mended at the source: a fetch that failed, nothing published
yet, a `cwd` or `bin` that is not there, a recipe that does not compile or
whose command is not found (126/127), vendor headers the build needs. A box
powered off over a typo would take the fleet down with it; this one
re-dials and builds the next publish.

A published tree (file:// or rsync:// pointing at `fdl publish`'s served
tree) carries `.fdl-run.yml`: its cwd, build, bin, args and run id are the
run's, and come from there. Without a manifest, the worker needs
`--source-bin` to know what to build; with neither, nothing is published
there yet (or a publish is under way) and the next dial looks again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, NamedTuple, TypeVar

from fdl.errors import BuildError
from fdl.hostside.envvars import FDL_GPU_FEATURE

Note = Callable[[str], None]
_T = TypeVar("_T")
COMMAND_NOT_EXECUTABLE, COMMAND_NOT_FOUND = 126, 127  # the shell's own exit statuses
_AT_SOURCE = "It comes from the source, and is mended there: the next dial fetches and builds again."

if TYPE_CHECKING:
    from fdl.hostside.libtorch.variants import Libtorch
    from fdl.publish.manifest import Manifest


class Built(NamedTuple):
    """A training binary built from --source."""

    binary: Path
    cwd: Path
    args: tuple[str, ...] | None  # the run's args from the manifest, None without one
    run_id: str | None
    origin: str


def fetch(spec_text: str, tree: Path, *, identity: str | None, source_bin: str | None, note: Note,
          env: Mapping[str, str] | None = None) -> Manifest | None:
    """Bring the source into `tree`; returns the run manifest, or None for an unpublished tree. `env`: the
    environment the fetch runs in (the agent's, whose RSYNC_RSH and GIT_SSH_COMMAND may pin the door)."""
    from fdl.publish.fetch import check_tools, materialize, pull_run
    from fdl.publish.manifest import ManifestMissing, read_manifest
    from fdl.publish.spec import GitSource, parse_source_spec

    spec = parse_source_spec(spec_text)
    check_tools(spec)
    if isinstance(spec, GitSource):
        materialize(spec, tree, identity=identity, note=note, env=env)
        return read_manifest(tree)
    try:
        return pull_run(spec, tree, identity=identity, note=note, env=env)
    except ManifestMissing:
        if source_bin is None:
            raise
        note(f"source: no run manifest at {spec.spec}; building it as a plain tree (--source-bin {source_bin})")
        # a plain tree is pulled like a published one: no link that points outside it comes along
        materialize(spec, tree, identity=identity, note=note, safe_links=True, writable_dirs=True, env=env)
        return None


def _pick(flag: _T | None, manifest_value: _T | None, default: _T, what: str, note: Note) -> _T:
    if flag is not None:
        if manifest_value is not None and flag != manifest_value:
            note(f"source: --source-{what} {flag!r} overrides the published run's {what} {manifest_value!r}")
        return flag
    return manifest_value if manifest_value is not None else default


def build(spec_text: str, tree: Path, *, cwd: str | None, recipe: str | None, source_bin: str | None,
          identity: str | None, libtorch: Libtorch | None, output: IO[str] | None = None,
          note: Note = lambda _: None, env: Mapping[str, str] | None = None) -> Built:
    """Fetch and build; `libtorch` is a fdl.hostside.libtorch.variants.Libtorch (None: a recipe that links none)."""
    from fdl.libtorch.gate import build_env
    from fdl.publish.gate import header_install_line, headers_present, package_manager, run_recipe, vendor_header
    from fdl.publish.manifest import DEFAULT_BUILD, check_tree_path
    from fdl.publish.spec import anonymize_url

    manifest = fetch(spec_text, tree, identity=identity, source_bin=source_bin, note=note, env=env)
    if manifest is not None:
        age = "" if not manifest.published_epoch else f", published at epoch {manifest.published_epoch}"
        note(f"source: run {manifest.run[:12]} from {manifest.origin or anonymize_url(spec_text)}{age}")
        if not manifest.built:
            note("source: WARNING: the publisher skipped its build gate (--no-build): nothing has compiled this "
                 "tree before this box")
    project = _pick(cwd, manifest.cwd if manifest else None, ".", "cwd", note)
    recipe = _pick(recipe, manifest.build if manifest else None, DEFAULT_BUILD, "build", note)
    binary = _pick(source_bin, manifest.bin if manifest else None, None, "bin", note)
    if binary is None:
        raise BuildError("the fetched tree has no run manifest to name the artifact to run, and no --source-bin "
                         "does.", hint="Give --source-bin target/release/<name> (relative to the project "
                                       "directory), or point --source at a published run; the next dial fetches "
                                       "again.")
    try:
        project = check_tree_path(project, "the run's cwd")
        check_tree_path(binary, "the run's bin", base=project)
    except ValueError as exc:
        raise BuildError(f"{exc}.", hint=_AT_SOURCE) from None
    directory = tree / project
    if not directory.is_dir():
        raise BuildError(f"the project directory '{project}' is not in the fetched tree ({directory}).",
                         hint="The run's cwd (--cwd of fdl publish, or --source-cwd here) is a directory inside "
                              "the tree. " + _AT_SOURCE)
    env = build_env(libtorch)
    env.pop("CARGO_TARGET_DIR", None)  # bin is relative to the project's own target/
    if manifest is not None and manifest.rustc:
        _compare_rustc(manifest.rustc, env, note)
    note(f"build: `{recipe}` in {directory}"
         + (f" against {libtorch.path} ({FDL_GPU_FEATURE}={libtorch.feature or 'none'})" if libtorch else ""))
    code = run_recipe(recipe, directory, env, output)
    if code in (COMMAND_NOT_EXECUTABLE, COMMAND_NOT_FOUND):
        raise BuildError(
            f"the build recipe `{recipe}` could not run a command (exit {code}: "
            f"{'not found' if code == COMMAND_NOT_FOUND else 'not executable'}; the shell's words are above).",
            hint="Install what the recipe runs in this user's PATH (for cargo: rustup, https://rustup.rs), or fix "
                 "the recipe at the source (fdl publish --build). " + _AT_SOURCE)
    if code != 0:
        vendor = None if libtorch is None else libtorch.vendor
        if libtorch is not None and vendor is not None and not headers_present(vendor, env):
            line = header_install_line(vendor, package_manager(env.get("PATH")))
            raise BuildError(
                f"the source did not compile (`{recipe}` exited {code}), and this box has no "
                f"{'CUDA' if vendor == 'nvidia' else 'ROCm (HIP)'} development headers ({vendor_header(vendor)}) "
                f"for the {libtorch.label} libtorch it builds against.\n  install: {line}",
                hint="Install them, or publish a tree that builds without them; the next dial builds again.")
        raise BuildError(
            f"the source did not compile: `{recipe}` exited {code} in {directory} (its output is above). This is "
            f"transient on purpose: fix it at the source and the next dial builds again.")
    artifact = directory / binary
    if not artifact.is_file():
        raise BuildError(f"the build passed but the binary '{binary}' is not there ({artifact}).",
                         hint="The run's bin (--bin of fdl publish, or --source-bin here) is the built artifact "
                              "relative to the project directory. " + _AT_SOURCE)
    if not os.access(artifact, os.X_OK):
        raise BuildError(f"the built binary {artifact} is not executable.",
                         hint="The recipe must leave an executable (chmod +x). " + _AT_SOURCE)
    return Built(binary=artifact, cwd=directory, args=None if manifest is None else tuple(manifest.args),
                 run_id=None if manifest is None else manifest.run, origin=anonymize_url(spec_text))


def _compare_rustc(published: str, env: dict[str, str], note: Note) -> None:
    """The manifest's `rustc -V` against this box's: a mismatch is reported, never enforced (advisory)."""
    from fdl.publish.gate import rustc_version

    here = rustc_version(env)
    if here != published:
        note(f"rustc: the run was published with `{published}`, this box builds with "
             f"{f'`{here}`' if here else 'no rustc'} (advisory: reported, never enforced)")
