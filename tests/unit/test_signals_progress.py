"""The shared signal policy (fdl.signals) and terminal progress pieces (fdl.progress), with real signals."""

from __future__ import annotations

import io
import os
import signal
import threading

import pytest

from fdl.progress import HostsProgress, StatusLine
from fdl.signals import Interrupts, die_of, stop_on


class Stop(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def test_interrupts_turn_the_first_signal_into_a_cancel_and_a_second_ctrl_c_into_keyboardinterrupt():
    before = signal.getsignal(signal.SIGINT)
    cancel = threading.Event()
    with Interrupts(cancel) as interrupts:
        os.kill(os.getpid(), signal.SIGTERM)
        assert cancel.is_set() and interrupts.signal == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # put back on the way out


def test_interrupts_outside_the_main_thread_install_nothing():
    seen = []

    def body():
        with Interrupts(threading.Event()):
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before]


def test_stop_on_raises_once_then_the_default_action_is_back_and_everything_is_restored():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with pytest.raises(Stop) as caught, stop_on(Stop):
        os.kill(os.getpid(), signal.SIGHUP)
    assert caught.value.signum == signal.SIGHUP
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_stop_on_leaves_default_actions_during_the_teardown():
    during = {}
    with pytest.raises(Stop), stop_on(Stop):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:  # the teardown runs here: a second signal would end the process
            during = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    assert set(during.values()) == {signal.SIG_DFL}


def test_die_of_ends_the_process_by_that_signal():
    pid = os.fork()
    if pid == 0:  # child
        try:
            die_of(signal.SIGTERM)
        finally:
            os._exit(3)  # only reached if the signal did not end it
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM


def test_status_line_keeps_permanent_lines_and_drops_the_transient_one_off_a_terminal():
    out = io.StringIO()
    line = StatusLine(out)
    line.line("  - Build the image")
    line.status("    still building: 0m05s elapsed")
    line.status("    still building: 0m06s elapsed")
    line.clear()
    line.line("  - Install")
    assert out.getvalue() == "  - Build the image\n  - Install\n"  # no \r ticker written into a log


def test_hosts_progress_counts_finished_hosts():
    from rich.console import Console

    class State:
        def __init__(self, status, task=None, message=None):
            self.status, self.current_task, self.message = status, task, message

    progress = HostsProgress("dispatch", ["a", "b"])
    progress.update({"a": State("failed", message="Permission denied"), "b": State("running", task="Stage")})
    console = Console(record=True, width=100)
    console.print(progress)
    text = console.export_text()
    assert "dispatch: 1/2 hosts done" in text and "Permission denied" in text and "Stage" in text
