"""The human views of state.json that `fdl status` prints (fdl.cli.render.status)."""

from __future__ import annotations

from fdl.cli.render.status import duration, live_view, render_state, start_line, status_line
from fdl.controller.machine import RunMachine
from fdl.controller.policy import RunPolicy
from fdl.controller.protocol import Hello
from fdl.controller.view import deadlines
from fdl.hostside.checks.devices import parse_devices
from tests.controller_util import FakeClock


def state_of(clock: FakeClock, hosts: int, **policy) -> tuple[RunMachine, dict]:
    m = RunMachine(RunPolicy(**policy), clock=clock, wall=lambda: 1_700_000_000.0)
    for i in range(hosts):
        m.hello(Hello(host=f"h{i:03d}", devices=parse_devices("cpu:1")), peer="127.0.0.1", trusted=True)
    return m, m.state()


def test_duration() -> None:
    assert [duration(x) for x in (None, 4.24, 75, 3725, -3)] == ["-", "4.2s", "1m15s", "1h02m05s", "0.0s"]


def test_idle_window_and_auto_switch_lines() -> None:
    _, state = state_of(FakeClock(), 0, window_s=600, quorum_hosts=2)
    text = render_state(state, "127.0.0.1:1337")
    assert "waiting  (discovery window, start: auto)" in text
    assert "its 10m00s start counting at the first admission" in text and "joined: nobody yet" in text
    _, state = state_of(FakeClock(), 2, window_s=600, quorum_hosts=2)
    text = render_state(state, "x:1")
    assert "switch: none (start: auto); forms when the roster is complete or the window closes" in text


def test_failed_run_names_its_reason_and_big_rosters_are_cut() -> None:
    clock = FakeClock()
    m, _ = state_of(clock, 70, window_s=5, quorum_hosts=100, silence_s=1e6)
    clock.advance(6)
    m.tick()
    text = render_state(m.state(), "x:1")
    assert ": failed" in text and "reason: the window closed without quorum (70 of 100 hosts)" in text
    assert "window: closed" in text and "h063" in text and "h064" not in text
    assert "... and 6 more (fdl status --json lists every host)" in text


def test_formed_world_line() -> None:
    m, _ = state_of(FakeClock(), 2, window_s=600, start="manual", quorum_hosts=2)
    m.fire(peer="127.0.0.1", trusted=True)
    text = render_state(m.state(), "x:1")
    assert "world: 2 rank(s) on 2 host(s), backend gloo, rendezvous 127.0.0.1:1338; formed by start switch" in text
    assert "switch: fired by 127.0.0.1" in text


def test_start_line_is_what_fires_the_switch_from_here() -> None:
    # this user's own run: fdl found its token, nothing to add; loopback alone is no credential
    assert start_line("127.0.0.1:1337", token_found=True) == "fdl start --addr 127.0.0.1:1337"
    assert start_line("127.0.0.1:1337") == "fdl start --addr 127.0.0.1:1337 --token-file TOKEN_FILE"
    assert start_line("10.0.0.1:1337", env="farm", from_env=True) == "fdl @farm start"  # the env's token
    assert start_line("10.0.0.1:1337", from_env=True) == "fdl start"  # base fdl.yml holds the cluster
    # regression: the hint printed `--token TOKEN`, a token on the command line every user can read in ps
    assert start_line("10.0.0.1:1337") == "fdl start --addr 10.0.0.1:1337 --token-file TOKEN_FILE"
    assert "--token " not in start_line("10.0.0.1:1337")


def test_deadlines_and_the_plain_watch_line_follow_the_window() -> None:
    clock = FakeClock()
    m, state = state_of(clock, 0, window_s=600, quorum_hosts=2, start="manual", silence_s=1e6)
    assert deadlines(state) == []  # an idle window has no deadline yet
    m.hello(Hello(host="a", devices=parse_devices("cpu:2")), peer="127.0.0.1", trusted=True)
    clock.advance(75)
    (window,) = deadlines(m.state())
    assert (window.name, window.seconds_left, window.total) == ("window", 525.0, 600.0)
    line = status_line(m.state(), "fdl start --addr x:1")
    assert line == ("phase waiting; quorum 1/2 hosts, 2 ranks not met; join window closes in 8m45s; "
                    "switch unarmed; fdl start fires it once quorum is met")
    m.hello(Hello(host="b", devices=parse_devices("cpu:1")), peer="127.0.0.1", trusted=True)
    assert status_line(m.state(), "fdl start --addr x:1").endswith(
        "quorum 2/2 hosts, 3 ranks met; join window closes in 8m45s; switch roster startable, fire with "
        "fdl start --addr x:1")
    clock.advance(600)
    m.tick()
    state = m.state()
    assert deadlines(state) == [] and status_line(state) == (
        "phase failed; quorum 2/2 hosts, 3 ranks met; switch not fired; reason: the window closed before the "
        "start switch was fired (2 of 2 hosts)")


# regression: a detail or GPU name with rich markup rendered as markup ([link=...]); a lone surrogate
# crashed `fdl status` with UnicodeEncodeError; escape sequences reached the terminal.
HOSTILE = "[link=https://evil.example]click[/link][bold red]x\x1b[2J\x1b]8;;https://evil\x07\ud800\u2028"


def hostile_state() -> dict:
    clock = FakeClock()
    m, _ = state_of(clock, 1, window_s=600, start="manual", quorum_hosts=1)
    member = next(iter(m.members.values()))
    member.gpu_names = (HOSTILE,)
    m.fire(peer="127.0.0.1", trusted=True)
    m.report_exit(member.ticket, 3, HOSTILE)
    return m.state()


def test_what_a_peer_sent_is_printed_as_data() -> None:
    state = hostile_state()
    for text in (render_state(state, "127.0.0.1:1337"), status_line(state)):
        assert text.replace("\n", "").isprintable()  # no escape, no surrogate, no separator
        text.encode("utf-8")  # and it encodes
        assert "[link=https://evil.example]click[/link]" in text  # shown literally


def test_the_live_view_never_parses_peer_text_as_markup() -> None:
    import io

    from rich.console import Console

    state = hostile_state()
    out = io.StringIO()
    console = Console(file=out, width=400, color_system="truecolor", force_terminal=True)
    console.print(live_view(state, HOSTILE, "127.0.0.1:9", start_cmd="fdl start", height=60))
    text = out.getvalue()
    assert "\x1b]8;" not in text  # no hyperlink was made
    assert "[link=https://evil.example]click[/link]" in text and "\x1b[2J" not in text and "\ud800" not in text
