"""The model-signature probe: a short CPU-only run of the training binary before the dial.

The binary is started with the run's arguments, `CUDA_VISIBLE_DEVICES=""`
(no GPU is touched) and `FDL_SIGNATURE_PROBE=1`; a binary that knows the
convention builds its model, prints one line

    fdl-signature: <hex>

and exits. fdl reads that line (stdout or stderr), ends the process group
the moment it has it, and puts the signature in its hello: the window
refuses a box whose model differs from the cohort's. The probe is bounded
by a timeout (FDL_SIGNATURE_TIMEOUT_S, default 120 s); a binary that prints
no signature joins unsigned, with a note. `--no-sig-probe` skips it for a
binary whose startup is too heavy to run twice per dial.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from fdl.errors import FdlError
from fdl.hostside.envvars import FDL_SIGNATURE_PROBE, FDL_SIGNATURE_TIMEOUT_S, read
from fdl.hostside.supervisor import die_with_parent, stop_process_group

PREFIX = "fdl-signature:"
DEFAULT_TIMEOUT_S = 120.0
_HEX = re.compile(r"^[0-9a-fA-F]{8,128}$")
_MAX_LINE = 4096


def probe_timeout(environ: Mapping[str, str] | None = None) -> float:
    try:
        value = float(read(FDL_SIGNATURE_TIMEOUT_S, environ).strip() or DEFAULT_TIMEOUT_S)
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def probe_signature(argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str], timeout_s: float,
                    note: Callable[[str], None] = lambda _: None) -> str | None:
    """Run the probe; the signature (lower-case hex), or None when the binary printed none."""
    probe_env = dict(env)
    probe_env["CUDA_VISIBLE_DEVICES"] = ""
    probe_env[FDL_SIGNATURE_PROBE] = "1"
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, env=probe_env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent)  # noqa: PLW1509 - PR_SET_PDEATHSIG can only be set in the child between fork and exec
    except OSError as exc:
        raise FdlError(f"cannot start the training binary {argv[0]}: {exc.strerror or exc}.",
                       hint="Check the path, that it is executable on this box and that its interpreter (#!) is "
                            "installed; the next dial tries again.") from None
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    signature: str | None = None
    bad: str | None = None
    tail: list[str] = []
    buffer = b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while signature is None:
            left = deadline - time.monotonic()
            if left <= 0:
                note(f"signature: no signature within {timeout_s:g} s; joining unsigned")
                break
            if not sel.select(min(left, 0.5)):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                line = raw[:_MAX_LINE].decode("utf-8", "replace").strip()
                tail = (tail + [line])[-5:]
                if line.startswith(PREFIX):
                    value = line[len(PREFIX):].strip()
                    if _HEX.match(value):
                        signature = value.lower()
                        break
                    bad = value
            if len(buffer) > _MAX_LINE:
                buffer = buffer[-_MAX_LINE:]
    finally:
        sel.close()
        _end(proc)
    if signature is not None:
        note(f"signature: {signature}")
        return signature
    if bad is not None:
        note(f"signature: ignored a malformed line ({PREFIX} {bad[:40]!r} is not 8-128 hex digits); joining unsigned")
    elif proc.returncode not in (None, 0, -signal.SIGTERM, -signal.SIGKILL):
        shown = " | ".join(t for t in tail if t)[-300:]
        note(f"signature: the probe exited {proc.returncode} without a signature ({shown or 'no output'}); "
             f"joining unsigned")
    else:
        note("signature: the binary printed none; joining unsigned (--no-sig-probe skips the probe)")
    return None


def _end(proc: subprocess.Popen) -> None:
    """Stop the probe and anything it started (its own process group)."""
    stop_process_group(proc)
    if proc.stdout is not None:
        proc.stdout.close()
