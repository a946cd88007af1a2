"""A listening join window always has a secret, and the launcher's hosts are reserved for it.

regression: a default `fdl @cluster CMD` listened on 0.0.0.0 with no token while the pre-flight build ran, and
any peer could claim a roster host's name."""

from __future__ import annotations

import stat
from dataclasses import replace
from pathlib import Path

import pytest

from fdl.config import schema
from fdl.controller.policy import RunPolicy
from fdl.controller.server import ControllerServer
from fdl.errors import FdlError
from fdl.hostside.checks.devices import Devices
from fdl.launch.plan import plan_launch
from fdl.launch.run import Launcher
from tests.controller_util import free_port

CPU1 = Devices(kind="cpu", count=1)


def plan(bind: str = "0.0.0.0", token: str | None = None, insecure: bool = False, discovery: bool = False):
    worker = schema.WorkerSpec(host="b", address="10.0.0.12", local_devices=CPU1)
    join = schema.JoinPolicy(discovery=discovery, token=token, insecure_no_token=insecure)
    cluster = schema.ClusterSpec(controller=schema.ControllerSpec(bind=bind, join=join), ssh=schema.SshDefaults(),
                                 workers=(worker,))
    return plan_launch(schema.CommandSpec(name="t", cluster=True, run="true"), [], cluster, Path("/p"),
                       is_local=lambda a, p: False)


class Notes:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def line(self, text: str) -> None:
        pass


def test_a_launcher_window_beyond_loopback_gets_a_fresh_token_kept_0600(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    printer = Notes()
    launcher = Launcher(plan(discovery=True), printer=printer)
    policy = launcher._policy()
    token_file = launcher.run_dir / "token"
    assert policy.token and len(policy.token) == 64 and token_file.read_text().strip() == policy.token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert policy.reserved == frozenset({"b"})
    assert not any(policy.token in note for note in printer.notes)  # never printed
    assert any("made its own" in note for note in printer.notes)
    again = Launcher(plan(discovery=True), printer=Notes())._policy()
    assert again.token != policy.token  # one per run


def test_a_configured_token_is_kept_and_a_loopback_window_gets_one_too(tmp_path, monkeypatch) -> None:
    # regression: a window on loopback had no token, and every account on the box could join and fire it
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Launcher(plan(token="abc" * 11), printer=Notes())._policy().token == "abc" * 11
    local = Launcher(plan(bind="127.0.0.1"), printer=Notes())
    token = local._policy().token
    assert token and len(token) == 64
    assert stat.S_IMODE((local.run_dir / "token").stat().st_mode) == 0o600
    assert stat.S_IMODE(local.run_dir.stat().st_mode) == 0o700


def test_the_explicit_opt_out_is_warned_about_at_every_start(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    printer = Notes()
    assert Launcher(plan(insecure=True), printer=printer)._policy().token is None
    assert any(note.startswith("WARNING: cluster.controller.join.insecure_no_token") for note in printer.notes)


def test_the_controller_refuses_a_tokenless_window_on_any_bind() -> None:
    for host in ("0.0.0.0", "127.0.0.1"):
        with pytest.raises(FdlError, match="without a token") as info:
            ControllerServer(RunPolicy(window_s=60), host=host, port=free_port()).start()
        assert "insecure_no_token" in (info.value.hint or "")
    with ControllerServer(RunPolicy(window_s=60, insecure_no_token=True), host="0.0.0.0", port=free_port()):
        pass
    with ControllerServer(RunPolicy(window_s=60, token="t" * 32), host="0.0.0.0", port=free_port()):
        pass


# regression (issue 37, finding 7): a run's token file stayed in ~/.flodl/launch/runs/RUN/token after the run, and
# every earlier run's beside it, readable by every rank of the account.


def test_a_token_file_goes_with_its_run_and_earlier_runs_leftovers_are_swept(tmp_path, monkeypatch) -> None:
    import os
    import subprocess
    import sys

    from fdl.launch.tokens import TOKEN_OWNER, forget_token, sweep_tokens

    monkeypatch.setenv("HOME", str(tmp_path))
    launcher = Launcher(plan(bind="127.0.0.1"), printer=Notes())
    launcher._policy()
    mine = launcher.run_dir / "token"
    assert mine.is_file() and (launcher.run_dir / TOKEN_OWNER).read_text().strip() == str(os.getpid())
    runs = mine.parent.parent
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for name, owner in (("killed", gone.stdout.strip()), ("older-fdl", None), ("older-fdl-starting", None)):
        (runs / name).mkdir(mode=0o700)
        (runs / name / "token").write_text("ab" * 32 + "\n")
        (runs / name / "state.json").write_text("{}")
        if owner is not None:
            (runs / name / TOKEN_OWNER).write_text(owner + "\n")
    os.utime(runs / "older-fdl" / "token", (1, 1))  # long ago: its launcher (an fdl without the record) is gone
    assert sweep_tokens() == 2  # a launcher that is gone, and an old run from before the owner record
    assert not (runs / "killed" / "token").exists() and not (runs / "older-fdl" / "token").exists()
    assert (runs / "older-fdl-starting" / "token").exists()  # recent, unowned: its launcher may be starting
    assert (runs / "killed" / "state.json").exists()  # the run's record stays; only its token goes
    assert mine.is_file()  # this launcher still runs: its token stays
    forget_token(mine)
    assert sorted(p.name for p in launcher.run_dir.iterdir()) == []


def test_a_launcher_that_cannot_listen_leaves_no_token_behind(tmp_path, monkeypatch) -> None:
    import socket

    monkeypatch.setenv("HOME", str(tmp_path))
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        launcher = Launcher(replace(plan(bind="127.0.0.1"), port=port), printer=Notes())
        with pytest.raises(FdlError):
            launcher.run()
    assert list(launcher.run_dir.glob("token*")) == []


def test_a_discovery_launcher_prints_the_line_a_walk_in_joins_with_and_never_the_token(tmp_path, monkeypatch) -> None:
    """issue 38 item 10: the walk-in line named no address ("fdl join ..."), and a roster run offered it too."""
    monkeypatch.setenv("HOME", str(tmp_path))
    launcher = Launcher(plan(discovery=True), printer=Notes())
    token = launcher._policy().token
    shown = f"~/{launcher.run_dir.relative_to(tmp_path)}/token"
    assert launcher.walk_in_line() == (f'FDL_JOIN_TOKEN="$(cat {shown})" fdl join 127.0.0.1:1337 --bin PROGRAM '
                                       f"--devices DEVICES")
    assert token not in launcher.walk_in_line()
    configured = Launcher(plan(discovery=True, token="abc" * 11), printer=Notes())
    configured._policy()
    assert configured.walk_in_line() == "FDL_JOIN_TOKEN=<the run's token> fdl join 127.0.0.1:1337 --bin PROGRAM " \
                                        "--devices DEVICES"
    roster = Launcher(plan(), printer=Notes())
    roster._policy()
    assert roster.walk_in_line() is None  # nobody walks into a roster run
