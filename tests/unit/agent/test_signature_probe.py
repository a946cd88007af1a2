"""The model-signature probe: real child processes, CPU only, bounded, killed once the line is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fdl.agent.signature import probe_signature
from fdl.errors import FdlError
from tests.join_util import write_program


def test_reads_the_signature_and_hides_the_gpus(tmp_path):
    prog = write_program(tmp_path / "train", """
import hashlib, os, sys
assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and os.environ["FDL_SIGNATURE_PROBE"] == "1"
print("loading model", flush=True)
print("fdl-signature: " + hashlib.sha256(" ".join(sys.argv[1:]).encode()).hexdigest()[:32], flush=True)
""")
    sig = probe_signature([str(prog), "--model", "resnet"], cwd=str(tmp_path),
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"}, timeout_s=30)
    import hashlib

    assert sig == hashlib.sha256(b"--model resnet").hexdigest()[:32]


def test_the_probe_is_ended_once_the_line_is_read(tmp_path):
    """The call returns on the signature line: it does not wait for the binary to finish, it stops it (the
    binary gets SIGTERM, never reaches its end) and reaps it before returning."""
    pid, terminated, finished = tmp_path / "pid", tmp_path / "terminated", tmp_path / "finished"
    prog = write_program(tmp_path / "train", f"""
import os, signal, sys, time
def ended(signum, frame):
    open({str(terminated)!r}, "w").write(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, ended)
open({str(pid)!r}, "w").write(str(os.getpid()))
print("fdl-signature: ABCDEF0123456789", flush=True)
time.sleep(300)
open({str(finished)!r}, "w").write("the probe waited for the binary to finish")
""")
    assert probe_signature([str(prog)], cwd=None, env=dict(os.environ), timeout_s=30) == "abcdef0123456789"
    assert terminated.read_text() == "SIGTERM"
    assert not finished.exists()
    assert not Path(f"/proc/{pid.read_text()}").exists()  # reaped: not even a zombie is left


def test_a_binary_that_never_answers_joins_unsigned_after_the_timeout(tmp_path):
    prog = write_program(tmp_path / "train", "import time\ntime.sleep(60)\n")
    notes = []
    assert probe_signature([str(prog)], cwd=None, env=dict(os.environ), timeout_s=0.5, note=notes.append) is None
    assert any("no signature within 0.5 s" in n for n in notes)


def test_a_malformed_line_is_ignored_with_a_note(tmp_path):
    prog = write_program(tmp_path / "train", "print('fdl-signature: not-hex!')\n")
    notes = []
    assert probe_signature([str(prog)], cwd=None, env=dict(os.environ), timeout_s=10, note=notes.append) is None
    assert any("malformed" in n for n in notes)


def test_a_crashing_probe_is_noted_with_its_code(tmp_path):
    prog = write_program(tmp_path / "train", "import sys\nprint('boom', flush=True)\nsys.exit(3)\n")
    notes = []
    assert probe_signature([str(prog)], cwd=None, env=dict(os.environ), timeout_s=10, note=notes.append) is None
    assert any("exited 3" in n and "boom" in n for n in notes)


def test_a_binary_that_cannot_start_is_transient(tmp_path):
    # whether a --bin is there is decided before the first dial (fdl.agent.permanent); a fetched tree's binary
    # that cannot start (gone, or its #! interpreter missing) is the publisher's to mend: the next dial tries again
    with pytest.raises(FdlError) as err:
        probe_signature([str(tmp_path / "nope")], cwd=None, env=dict(os.environ), timeout_s=5)
    assert err.value.exit_code == 1 and "cannot start the training binary" in err.value.message
