"""The `--persist` loop after the permanence check: no failure of an attempt ends it, an OSError nobody classed
included, and each one is said with what would mend it; one-shot exits 1 for the same failures."""

from __future__ import annotations

import errno

import pytest

from fdl.agent.agent import JoinAgent
from fdl.agent.failures import Stopped
from fdl.agent.options import resolve_options
from fdl.errors import FdlError, UsageError
from tests.join_util import write_program


class Scripted(JoinAgent):
    """A real agent whose attempts raise what the test lists, then stop (a SIGTERM): the loop is what is tested."""

    def __init__(self, failures: list[BaseException], **kwargs):
        super().__init__(**kwargs)
        self.failures = failures

    def attempt(self) -> int:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        raise Stopped(15)


def agent(tmp_path, failures, *, persist: bool) -> tuple[Scripted, list[str]]:
    binary = write_program(tmp_path / "train", "print('train')\n")
    options = resolve_options(None, {"controller": "127.0.0.1:1", "bin": str(binary), "devices": "cpu:1",
                                     "persist": persist}, None, environ={})
    notes: list[str] = []
    return Scripted(failures, options=options, note=notes.append, sleep=lambda _: None,
                    environ={"FDL_JOIN_STAGE": str(tmp_path / "stage"), "HOME": str(tmp_path)}), notes


def test_an_unexpected_oserror_does_not_end_persist(tmp_path):
    """regression: an OSError nobody classed (EIO from statvfs on a stale mount, a PermissionError on a read-only
    tree root) left the loop: `fdl join --persist` ended with exit 1, "internal error"."""
    failures: list[BaseException] = [
        OSError(errno.EIO, "Input/output error", "/flodl/data"),
        PermissionError(errno.EACCES, "Permission denied", "/var/lib/fdl-join/.flodl/join/source/tree/.fdl-run.yml"),
        OSError(errno.ENOSPC, "No space left on device"),
    ]
    worker, notes = agent(tmp_path, failures, persist=True)
    with pytest.raises(Stopped):
        worker.run()
    assert worker.attempts == 4  # three failures re-dialed, the fourth attempt was stopped
    failed = [n for n in notes if n.startswith("transient failure:")]
    assert len(failed) == 3 and sum("re-dialing in" in n for n in notes) == 3
    assert "/flodl/data: Input/output error (EIO)" in failed[0] and "network mount" in failed[0]
    assert "Permission denied (EACCES)" in failed[1] and "writable directories" in failed[1]
    assert "No space left on device (ENOSPC)" in failed[2] and "free space" in failed[2]


def test_nothing_after_the_check_is_permanent(tmp_path):
    # whatever an attempt raises, with whatever code, is transient: only the check before the first dial is not
    worker, notes = agent(tmp_path, [UsageError("raised by a dial"), FdlError("x", exit_code=3)], persist=True)
    with pytest.raises(Stopped):
        worker.run()
    assert worker.attempts == 3 and sum(n.startswith("transient failure: raised by a dial") for n in notes) == 1


@pytest.mark.parametrize("failure", [OSError(errno.EIO, "Input/output error", "/flodl/data"), UsageError("dial")])
def test_one_shot_exits_1_for_the_same(tmp_path, failure):
    worker, _ = agent(tmp_path, [failure], persist=False)
    with pytest.raises(FdlError) as err:
        worker.run()
    assert err.value.exit_code == 1


def test_the_check_runs_before_the_first_dial_and_is_permanent(tmp_path):
    worker, _ = agent(tmp_path, [], persist=True)
    worker.options = worker.options._replace(bin=str(tmp_path / "gone"))
    with pytest.raises(FdlError) as err:
        worker.run()
    assert err.value.exit_code == 2 and worker.attempts == 0
