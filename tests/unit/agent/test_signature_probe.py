"""The model-signature probe: real child processes, CPU only, bounded, killed once the line is read."""

from __future__ import annotations

import os
import time

import pytest

from fdl.agent.signature import probe_signature
from fdl.errors import PermanentError
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
    marker = tmp_path / "still-running"
    prog = write_program(tmp_path / "train", f"""
import time
print("fdl-signature: ABCDEF0123456789", flush=True)
time.sleep(3)
open({str(marker)!r}, "w").write("the probe was left running")
""")
    started = time.monotonic()
    assert probe_signature([str(prog)], cwd=None, env=dict(os.environ), timeout_s=30) == "abcdef0123456789"
    time.sleep(3.5)
    assert not marker.exists()
    assert time.monotonic() - started < 30


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


def test_a_missing_binary_is_permanent(tmp_path):
    with pytest.raises(PermanentError) as err:
        probe_signature([str(tmp_path / "nope")], cwd=None, env=dict(os.environ), timeout_s=5)
    assert err.value.exit_code == 2 and "cannot start the training binary" in err.value.message
