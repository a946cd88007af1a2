"""Preparation before a dial: everything a box needs, acquired before admission starts its clock.

Admission starts the window's deadline, so nothing slow may happen after it.
`prepare` runs the steps in order and re-runs all of them on every attempt
(a `--persist` box picks up a changed source, a new libtorch or a remounted
data source on its next re-dial without reprovisioning):

1. GPU stack check (what this box offers: every GPU, `--devices` ids, or `cpu:N`);
2. the stage directories proven writable;
3. the dataset root (`--data-path`, mounted from `--data-source` when absent);
4. libtorch (`--libtorch`: downloaded when missing, from PyTorch's location or
   the configured mirror, fdl.libtorch.install; default: whatever is active here);
5. the training binary (`--bin`, or `--source` fetched and built here);
6. the model-signature probe (unless `--no-sig-probe`).

What is permanent was decided once, before the first dial
(fdl.agent.permanent); every failure here is transient (exit 1): a GPU, a
binary or a disk can go away between dials, and come back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, NamedTuple

from fdl.agent.data import prepare_data, prove_writable
from fdl.agent.options import JoinOptions
from fdl.agent.signature import probe_signature, probe_timeout
from fdl.errors import FdlError
from fdl.hostside.envvars import FDL_DATA_PATH, FDL_GPU_FEATURE, FDL_GPU_RAM_SHARE, FDL_JOIN_STAGE, read
from fdl.hostside.paths import join_stage
from fdl.offer import Offer, check_gpu_stack

if TYPE_CHECKING:
    from fdl.hostside.libtorch.variants import Libtorch

Note = Callable[[str], None]


class Prepared(NamedTuple):
    """What a dial needs, all of it already on this box."""

    offer: Offer
    data_root: str | None
    libtorch: Libtorch | None
    binary: str
    cwd: str
    args: tuple[str, ...] | None
    run_id: str | None
    signature: str | None
    log_root: Path

    def rank_env(self, options: JoinOptions, base: Mapping[str, str]) -> dict[str, str]:
        """The environment every rank starts from: base, plus libtorch's libraries and the data plane."""
        from fdl.hostside.envvars import without_secrets
        from fdl.libtorch.gate import build_env

        env = without_secrets(dict(base))  # the join token never reaches a rank (nor the signature probe)
        if self.libtorch is not None:
            built = build_env(self.libtorch, env)
            for key in ("LIBTORCH_PATH", "LD_LIBRARY_PATH", FDL_GPU_FEATURE):
                env[key] = built[key]
        if self.data_root is not None:
            env[FDL_DATA_PATH] = self.data_root
        if options.gpu_ram_share is not None:
            env[FDL_GPU_RAM_SHARE] = repr(options.gpu_ram_share)
        return env


def stage_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where `fdl join` keeps its source tree and rank logs: $FDL_JOIN_STAGE or ~/.flodl/join."""
    given = read(FDL_JOIN_STAGE, environ).strip()
    return Path(given).expanduser() if given else join_stage(environ)


def _resolve_libtorch(options: JoinOptions, offer: Offer, environ: Mapping[str, str], note: Note) -> Libtorch | None:
    from fdl.libtorch.gate import resolve_active
    from fdl.libtorch.install import ensure_variant
    from fdl.libtorch.source import route_auto

    if options.libtorch is None:
        active = resolve_active(None, environ)
        if active is not None:
            note(f"libtorch: using the active {active.label} ({active.path})")
        return active
    variant = route_auto(offer.vendor, offer.capabilities) if options.libtorch == "auto" else options.libtorch
    if options.libtorch == "auto":
        note(f"libtorch: auto picked {variant} for {offer.summary}")
    installed = ensure_variant(variant, source=options.libtorch_source, environ=environ, note=note)
    installed.libtorch.source = "fdl join"
    return installed.libtorch


def prepare(options: JoinOptions, *, environ: Mapping[str, str] | None = None, note: Note = lambda _: None,
            build_output: IO[str] | None = None) -> Prepared:
    """Run every preparation step; raises FdlError (exit code = its class) on the first that fails."""
    environ = os.environ if environ is None else environ
    offer = check_gpu_stack(options.devices, environ)
    note(f"gpu: {offer.summary}")

    stage = stage_root(environ)
    writable = [stage, stage / "logs"]
    if options.source is not None:
        writable.append(stage / "source")
    prove_writable(writable, note=note)

    data_root = prepare_data(options.data_root, options.data_source, identity=options.identity, environ=environ,
                             note=note)
    libtorch = _resolve_libtorch(options, offer, environ, note)

    run_id = None
    manifest_args = None
    if options.source is not None:
        from fdl.agent.source import build

        built = build(options.source, stage / "source" / "tree", cwd=options.source_cwd,
                      recipe=options.source_build, source_bin=options.source_bin, identity=options.identity,
                      libtorch=libtorch, output=build_output, note=note, env=environ)
        binary, cwd, run_id, manifest_args = str(built.binary), str(built.cwd), built.run_id, built.args
    else:
        assert options.bin is not None
        binary = os.path.abspath(options.bin)
        if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
            raise FdlError(f"the training binary {binary} (--bin) is not there or not executable any more.",
                           hint="It was when fdl join started: put it back (chmod +x); the next dial checks again.")
        cwd = os.getcwd()
    prove_writable([cwd], what="the directory the ranks run in")  # they write their outputs relative to it

    if options.args_given:
        args = options.args
    elif manifest_args is not None:
        args = manifest_args
        if options.args is not None and tuple(options.args) != tuple(manifest_args):
            note("args: the published run's arguments replace the join: block's args (they must match the run)")
    else:
        args = options.args

    signature = None
    if options.no_sig_probe:
        note("signature: probe skipped (--no-sig-probe)")
    else:
        probe_env = Prepared(offer, data_root, libtorch, binary, cwd, args, run_id, None, stage).rank_env(
            options, environ)
        signature = probe_signature([binary, *(args or ())], cwd=cwd, env=probe_env,
                                    timeout_s=probe_timeout(environ), note=note)
    return Prepared(offer=offer, data_root=data_root, libtorch=libtorch, binary=binary, cwd=cwd, args=args,
                    run_id=run_id, signature=signature, log_root=stage / "logs")
