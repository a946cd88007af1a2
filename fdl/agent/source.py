"""`--source`: fetch the training tree to local disk and build it here, against this box's libtorch.

The spec parser, the fetchers, the run manifest and the recipe runner are
`fdl publish`'s own (fdl.publish); this module only decides what a worker
does with them and how each failure is classed:

- a spec that does not parse, a missing fetch tool or build toolchain
  (the recipe's command not found), or an artifact missing after a
  successful build: permanent (2);
- a fetch that failed, nothing published yet, a tree that does not compile:
  transient (1). A compile error is transient on purpose: the fix is a push
  away at the source, and a box that stopped over a typo would be powered
  off by the systemd recipe;
- except a compile failure on a box whose vendor toolkit headers (CUDA,
  HIP) are demonstrably missing for the GPU libtorch it builds against:
  re-dialing cannot install a package, so that is permanent and the error
  names the package line.

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

from fdl.errors import BuildError, ExitCode, PermanentError
from fdl.hostside.envvars import FDL_GPU_FEATURE

Note = Callable[[str], None]
_T = TypeVar("_T")

if TYPE_CHECKING:
    from fdl.hostside.libtorch.variants import Libtorch
    from fdl.publish.manifest import Manifest
    from fdl.publish.spec import SourceSpec


class Built(NamedTuple):
    """A training binary built from --source."""

    binary: Path
    cwd: Path
    args: tuple[str, ...] | None  # the run's args from the manifest, None without one
    run_id: str | None
    origin: str


def check_source_spec(spec: str) -> SourceSpec:
    """Parse a --source spec; a spec that does not parse is permanent for a worker (exit 2)."""
    from fdl.publish.spec import SourceSpecError, parse_source_spec

    try:
        return parse_source_spec(spec)
    except SourceSpecError as exc:
        raise exc.permanent() from None


def fetch(spec_text: str, tree: Path, *, identity: str | None, source_bin: str | None, note: Note,
          env: Mapping[str, str] | None = None) -> Manifest | None:
    """Bring the source into `tree`; returns the run manifest, or None for an unpublished tree. `env`: the
    environment the fetch runs in (the agent's, whose RSYNC_RSH and GIT_SSH_COMMAND may pin the door)."""
    from fdl.publish.fetch import FetchError, check_tools, materialize, pull_run
    from fdl.publish.manifest import ManifestMissing, read_manifest
    from fdl.publish.spec import GitSource

    spec = check_source_spec(spec_text)
    try:
        check_tools(spec)
    except FetchError as exc:  # a missing rsync/git/ssh: re-dialing cannot install it
        raise PermanentError(exc.message, hint=exc.hint) from None
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
        materialize(spec, tree, identity=identity, note=note, safe_links=True, env=env)
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
        raise PermanentError("--source needs --source-bin: the fetched tree has no run manifest to name the "
                             "artifact to run.", hint="Give --source-bin target/release/<name> (relative to the "
                                                      "project directory), or point --source at a published run.")
    try:
        project = check_tree_path(project, "--source-cwd")
        check_tree_path(binary, "--source-bin", base=project)
    except ValueError as exc:
        raise PermanentError(f"{exc}.") from None
    directory = tree / project
    if not directory.is_dir():
        raise PermanentError(f"the project directory '{project}' is not in the fetched tree ({directory}).",
                             hint="--source-cwd is a directory inside the source tree.")
    env = build_env(libtorch)
    env.pop("CARGO_TARGET_DIR", None)  # bin is relative to the project's own target/
    note(f"build: `{recipe}` in {directory}"
         + (f" against {libtorch.path} ({FDL_GPU_FEATURE}={libtorch.feature or 'none'})" if libtorch else ""))
    code = run_recipe(recipe, directory, env, output)
    if code in (126, 127):
        raise PermanentError(
            f"the build recipe `{recipe}` could not run its command (exit {code}: not found or not executable): "
            f"the build toolchain is missing on this box.",
            hint="Install the toolchain the recipe needs (for cargo: rustup, https://rustup.rs) in this user's PATH.")
    if code != 0:
        vendor = None if libtorch is None else libtorch.vendor
        if libtorch is not None and vendor is not None and not headers_present(vendor, env):
            line = header_install_line(vendor, package_manager(env.get("PATH")))
            raise PermanentError(
                f"the source did not compile (`{recipe}` exited {code}), and this box has no "
                f"{'CUDA' if vendor == 'nvidia' else 'ROCm (HIP)'} development headers ({vendor_header(vendor)}) "
                f"for the {libtorch.label} libtorch it builds against. Re-dialing cannot install a package.\n"
                f"  install: {line}")
        raise BuildError(
            f"the source did not compile: `{recipe}` exited {code} in {directory} (its output is above). This is "
            f"transient on purpose: fix it at the source and the next dial builds again.",
            exit_code=ExitCode.FAILURE)
    artifact = directory / binary
    if not artifact.is_file():
        raise PermanentError(f"the build passed but the binary '{binary}' is not there ({artifact}).",
                             hint="--source-bin is the built artifact relative to the project directory.")
    if not os.access(artifact, os.X_OK):
        raise PermanentError(f"the built binary {artifact} is not executable.")
    return Built(binary=artifact, cwd=directory, args=None if manifest is None else tuple(manifest.args),
                 run_id=None if manifest is None else manifest.run, origin=anonymize_url(spec_text))
