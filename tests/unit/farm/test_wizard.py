"""The farm wizard as a library: prepare -> decide -> apply, driven through its seams.

Questions go to a scripted Prompter that records what was asked; the host is observed through an `observe`
that returns facts built by hand (a Debian box); everything is written under a temp directory (project,
HOME, sshd configuration). ssh-keygen mints the real key pair.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest
import yaml

from fdl.cli.render.join_config import render_json
from fdl.errors import FdlError
from fdl.farm.doctor import HostFacts
from fdl.farm.wizard.apply import apply
from fdl.farm.wizard.decide import decide
from fdl.farm.wizard.plan import Plan, prepare
from fdl.farm.wizard.report import CredentialAction, FarmReport, KeyAction, OverlayAction
from fdl.farm.wizard.shape import Origin, Request, Shape
from fdl.hostside.farm.authorized_keys import find_key

DEBIAN = HostFacts(system="Linux", distro="debian", package_manager="apt", init="systemd",
                   ssh_units=("ssh.service",), ssh_socket_active=False, sshd_path=None,
                   rrsync_path="/usr/bin/rrsync", served_is_dir=True)
FOREIGN = b"# the operator's own keys\r\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIForeignForeignForeignForeign01 me\r\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Scripted:
    """A Prompter answering from a script, in order; every question it is asked is recorded."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, str]] = []

    def _next(self, kind: str, question: str) -> object:
        self.asked.append((kind, question))
        assert self.answers, f"unexpected question: {question}"
        return self.answers.pop(0)

    def choose(self, question: str, choices: tuple[str, ...], default: str) -> str:
        answer = self._next("choose", question)
        assert answer in choices
        return str(answer)

    def text(self, question: str, default: str) -> str:
        return str(self._next("text", question))

    def confirm(self, question: str, default: bool) -> bool:
        return bool(self._next("confirm", question))


class Box:
    """A project, a HOME and an sshd configuration under tmp_path; runs the wizard's three phases."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.home, self.etc = tmp_path / "proj", tmp_path / "home", tmp_path / "etc-ssh"
        for d in (self.root, self.home, self.etc / "sshd_config.d"):
            d.mkdir(parents=True)
        os.chmod(self.home, 0o755)
        monkeypatch.setenv("HOME", str(self.home))
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)  # fdl's record of minted credentials: in this HOME
        self.sshd_config = self.etc / "sshd_config"
        self.host_key = self.etc / "ssh_host_ed25519_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.host_key)], check=True)
        self.sshd_config.write_text(f"Include {self.etc}/sshd_config.d/*.conf\nPort 22\nHostKey {self.host_key}\n"
                                    f"UsePAM no\n")
        (self.root / "fdl.yml").write_text("commands:\n  test:\n    run: 'true'\n")
        self.door_port = free_port()  # nothing listens there
        self.controller = f"op@127.0.0.1:{self.door_port}"
        self.facts = DEBIAN
        self.observed: list[dict[str, object]] = []

    def observe(self, **seen: object) -> HostFacts:
        self.observed.append(seen)
        return replace(self.facts, served=seen["served"])

    def request(self, **flags: object) -> Request:
        base: dict[str, object] = dict(label="lab", sshd_config=str(self.sshd_config), cwd=self.root)
        return Request(**{**base, **flags})

    def prepare(self, prompter: Scripted | None = None, **flags: object) -> tuple[Request, Plan]:
        req = self.request(**flags)
        return req, prepare(req, prompter, observe=self.observe)

    def run(self, prompter: Scripted | None = None, **flags: object) -> FarmReport:
        req, plan = self.prepare(prompter, **flags)
        return apply(plan, decide(plan, req, prompter), self.root)

    @property
    def farm(self) -> Path:
        return self.root / ".fdl" / "lab"

    @property
    def ak(self) -> Path:
        return self.home / ".ssh" / "authorized_keys"


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Box:
    return Box(tmp_path, monkeypatch)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def refused(excinfo: pytest.ExceptionInfo[FdlError]) -> FdlError:
    assert excinfo.value.exit_code == 1
    return excinfo.value


# --------------------------------------------------------------------------- plan: a fresh farm


def test_a_fresh_scripted_farm_plans_from_flags_and_defaults_and_asks_nothing(box):
    req, plan = box.prepare(controller=box.controller, assume_yes=True)
    assert plan.shape == Shape("b", "op", "127.0.0.1", box.door_port, 1337, str(box.home / ".flodl" / "run"))
    assert plan.shape_from.to_dict() == {"door": "default", "controller": "flag", "port": "default",
                                         "served": "default"}
    assert plan.existing is None and plan.rotate is False and plan.key_file.data is None
    assert plan.farm_dir == box.root / ".fdl" / "lab" and plan.overlay == box.root / "fdl.lab.yml"
    assert plan.dropin_target == str(box.etc / "sshd_config.d" / "01-fdl-lab.conf")
    assert plan.dropin["door_port"] == box.door_port
    # the doctor saw the drop-in in place and probed where workers dial
    (seen,) = box.observed
    assert seen["door_port"] == box.door_port and seen["probe_host"] == "127.0.0.1"
    assert seen["dropin_target"] == plan.dropin_target
    assert seen["dropin_lines"] == ["Port " + str(box.door_port), f"Match LocalPort {box.door_port}"]
    # the door's host key, read from the public half of the sshd's HostKey, pinned for the address workers dial
    key = (box.etc / "ssh_host_ed25519_key.pub").read_text().split()
    assert plan.host_keys == (f"[127.0.0.1]:{box.door_port} {key[0]} {key[1]}",)
    assert {f.name for f in plan.findings} >= {"sshd", "listener"}
    assert not box.farm.exists(), "prepare wrote something"
    with pytest.raises(FrozenInstanceError):
        plan.rotate = True

    decisions = decide(plan, req)
    assert decisions.install is False and decisions.perm_issues == ()
    assert any("--yes does not count" in note for note in decisions.notes)


def test_a_fresh_farm_is_written_with_private_modes_and_reported(box):
    report = box.run(controller=box.controller, assume_yes=True, cloud_init=True)
    farm = box.farm
    assert mode(farm) == 0o700
    for name, want in (("key", 0o600), ("key.pub", 0o600), ("token", 0o600), ("worker.yml", 0o600),
                       ("cloud-init.yml", 0o600), ("sshd-door.conf", 0o644), ("authorized_keys.line", 0o644),
                       ("door-selftest.sh", 0o755)):
        assert mode(farm / name) == want, name
    # the overlay names the token file and holds no secret
    overlay = (box.root / "fdl.lab.yml").read_text()
    assert mode(box.root / "fdl.lab.yml") == 0o644 and (farm / "token").read_text().strip() not in overlay
    assert yaml.safe_load(overlay)["cluster"]["controller"]["join"]["token_file"] == ".fdl/lab/token"
    assert (box.root / ".fdl" / ".gitignore").read_text().splitlines()[-1] == "*"
    assert "rrsync" in (farm / "authorized_keys.line").read_text()
    assert not list(farm.glob("*.fdl-tmp")) and not box.ak.exists()

    assert report.credentials.action == CredentialAction.CREATED
    assert report.overlay.action == OverlayAction.CREATED
    assert report.authorized_keys.action == KeyAction.NOT_INSTALLED and not report.authorized_keys.installed
    assert report.files.cloud_init == str(farm / "cloud-init.yml")
    titles = [s.title for s in report.steps]
    assert titles[0].startswith("Review what the wizard wrote")
    assert any(t.startswith("Install the key line into") for t in titles)
    assert report.steps[-1].command == "sh .fdl/lab/door-selftest.sh"
    assert [s.n for s in report.steps] == list(range(1, len(report.steps) + 1))


def test_the_json_twin_carries_the_records_and_no_secret(box):
    report = box.run(controller=box.controller, assume_yes=True)
    doc = json.loads(render_json(report))
    assert doc["controller"] == {"user": "op", "host": "127.0.0.1", "door_port": box.door_port,
                                 "training_port": 1337, "ssh": box.controller}
    assert doc["credentials"]["action"] == "created" and "modes_fixed" not in doc["credentials"]
    assert doc["overlay"]["action"] == "created" and "command" in doc["overlay"]
    assert doc["authorized_keys"]["action"] == "not-installed" and "removed_old" not in doc["authorized_keys"]
    assert doc["files"]["cloud_init"] is None and "overlay_snippet" not in doc["files"]
    assert [s["n"] for s in doc["steps"]] == [s.n for s in report.steps]
    text = json.dumps(doc)
    assert (box.farm / "token").read_text().strip() not in text
    assert (box.farm / "key").read_text().splitlines()[1] not in text


# --------------------------------------------------------------------------- a re-run


def test_a_rerun_recovers_the_shape_reuses_everything_and_changes_nothing(box, monkeypatch):
    box.run(controller=box.controller, assume_yes=True, install_key=True)
    before = {p.name: p.read_bytes() for p in box.farm.iterdir() if p.is_file()}
    overlay, key_file = (box.root / "fdl.lab.yml").read_bytes(), box.ak.read_bytes()

    reads: list[Path] = []
    real = Path.read_bytes

    def counting(path: Path) -> bytes:
        if path == box.ak:
            reads.append(path)
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", counting)
    req, plan = box.prepare()  # no flags, no terminal, no --yes: nothing needs deciding
    assert plan.shape_from.door == Origin.RECOVERED and plan.shape_from.controller == Origin.RECOVERED
    assert plan.shape.controller == box.controller and plan.existing is not None and not plan.rotate
    assert any("farm shape recovered" in note for note in plan.notes)
    decisions = decide(plan, req)
    assert decisions.install is False and decisions.notes == ()  # the exact line is there: nothing to say
    report = apply(plan, decisions, box.root)
    # regression: the key file was read once for the whole run (it was read twice for one check)
    assert len(reads) == 1

    assert report.credentials.action == CredentialAction.REUSED
    assert report.overlay.action == OverlayAction.UNCHANGED
    assert report.authorized_keys.action == KeyAction.ALREADY_PRESENT and report.authorized_keys.line == 1
    assert any(s.done and s.title.startswith("Key line installed") for s in report.steps)
    assert {p.name: p.read_bytes() for p in box.farm.iterdir() if p.is_file()} == before
    assert (box.root / "fdl.lab.yml").read_bytes() == overlay and box.ak.read_bytes() == key_file


def test_a_rerun_with_another_port_reports_the_installed_line_as_outdated(box):
    box.run(controller=box.controller, assume_yes=True, install_key=True)
    report = box.run(port=1400)
    assert report.shape.controller_port == 1400 and report.shape_from.port == Origin.FLAG
    assert report.authorized_keys.action == KeyAction.OUTDATED
    assert any("other options than this run composed" in note for note in report.notes)


def test_rotation_asks_and_replaces_the_old_key_line_in_place(box):
    box.ak.parent.mkdir(mode=0o700)
    box.ak.write_bytes(FOREIGN)
    os.chmod(box.ak, 0o600)
    first = box.run(controller=box.controller, assume_yes=True, install_key=True)
    old_pub = (box.farm / "key.pub").read_text()
    prompter = Scripted(False, True)  # keep the key and token? no. replace the old line? yes
    report = box.run(prompter, interactive=True)
    assert [kind for kind, _ in prompter.asked] == ["confirm", "confirm"]
    assert "Keep them?" in prompter.asked[0][1] and f"(line {first.authorized_keys.line})" in prompter.asked[1][1]
    assert report.credentials.action == CredentialAction.ROTATED
    assert (box.farm / "key.pub").read_text() != old_pub
    assert report.authorized_keys.action == KeyAction.REPLACED and report.authorized_keys.line == 3
    data = box.ak.read_bytes()
    assert data.startswith(FOREIGN) and data.count(b"fdl-farm-lab") == 1
    assert old_pub.split()[1].encode() not in data


def test_rotation_without_consent_and_without_a_terminal_is_refused(box):
    box.run(controller=box.controller, assume_yes=True, install_key=True)
    req, plan = box.prepare(regen=True, assume_yes=True)
    with pytest.raises(FdlError, match="rotating the farm's credentials leaves the old key installed") as excinfo:
        decide(plan, req)
    assert "--install-key" in (refused(excinfo).hint or "")


# --------------------------------------------------------------------------- doors


def test_door_b_prompts_in_order_and_installs_the_line_with_consent(box):
    prompter = Scripted("b", box.controller, True)  # the door, the controller, install the line?
    report = box.run(prompter, interactive=True)
    assert [kind for kind, _ in prompter.asked] == ["choose", "text", "confirm"]
    assert report.shape_from.door == Origin.PROMPT and report.shape_from.controller == Origin.PROMPT
    assert report.authorized_keys.action == KeyAction.ADDED and report.authorized_keys.installed
    assert report.authorized_keys.listening is not None and not report.authorized_keys.listening.answering
    assert mode(box.ak) == 0o600 and mode(box.ak.parent) == 0o700
    line = box.ak.read_text().strip()
    assert line == (box.farm / "authorized_keys.line").read_text().strip()
    assert f"exec /usr/bin/rrsync -ro -munge {box.home}/.flodl/run'\"" in line
    assert (box.farm / "installed-at").read_text() == f"{box.ak}\n"


def test_door_a_logs_in_as_its_jailed_account_and_installs_nothing_here(box):
    served = box.root / "data"
    served.mkdir()
    report = box.run(controller=f"fdl-lab@127.0.0.1:{box.door_port}", door="a", served=str(served),
                     jail_base=str(box.root / "jails"), assume_yes=True, install_key=True)
    assert report.shape.user == "fdl-lab" and report.shape.jail_base == str(box.root / "jails")
    ak = report.authorized_keys
    assert ak.action == KeyAction.JAILED and ak.path == str(box.root / "jails" / "lab" / ".ssh" / "authorized_keys")
    assert not box.ak.exists() and not Path(ak.path).exists()  # the jail is a privileged setup step
    titles = [s.title for s in report.steps]
    (privileged,) = [s for s in report.steps if s.title.startswith("Apply the privileged part")]
    assert "the door's own account fdl-lab" in privileged.title and str(box.root / "jails" / "lab" / "jail") \
        in privileged.title
    assert not any(t.startswith("Install the key line") for t in titles)
    assert json.loads(render_json(report))["authorized_keys"]["removed_unconfined"] is None
    variables = yaml.safe_load((box.farm / "join-door.yml").read_text())
    assert variables["fdl_join_door_door"] == "a" and variables["fdl_join_door_served"] == str(served)
    assert variables["fdl_join_door_jail_base"] == str(box.root / "jails")
    assert variables["fdl_join_door_privileged"] is True and variables["fdl_join_door_install_key"] is False


def test_door_a_removes_an_unconfined_farm_line_only_with_consent(box):
    box.run(controller=box.controller, door="b", assume_yes=True, install_key=True)
    box.ak.write_bytes(FOREIGN + box.ak.read_bytes())
    flags = dict(controller=f"fdl-lab@127.0.0.1:{box.door_port}", door="a", served=str(box.root),
                 jail_base=str(box.root / "jails"), assume_yes=True)
    req, plan = box.prepare(**flags)
    with pytest.raises(FdlError, match="line 3 lets the farm key of lab log in as this account"):
        decide(plan, req)
    report = box.run(**flags, install_key=True)
    gone = report.authorized_keys.removed_unconfined
    assert gone is not None and (gone.line, gone.removed) == (3, 1)
    assert box.ak.read_bytes() == FOREIGN


@pytest.mark.parametrize("flags, match", [
    (dict(door="a", controller="op@h:2222"), "door a's workers log in as the door's own jailed account fdl-lab"),
    (dict(door="tunnel-only", controller="op@h:2222", served="/srv"), "the tunnel-only door serves nothing"),
    (dict(door="b", controller="op@h:2222", jail_base="/srv/j"), "--jail-dir places door a's jail"),
    (dict(door="b", controller="op@h:22"), "the door cannot be port 22"),
    (dict(door="b", controller="op@h:2222", port=2222), "both 2222; they must differ"),
    (dict(door="b", controller="op@h:2222", port=70000), "--port 70000"),
    (dict(door="b", controller="bad user@h:2222"), "is not a login name"),
    (dict(door="b", controller="op@h:2222", authorized_keys="/tmp/k", install_key=False), "Drop one of them"),
    (dict(door="b", controller="op@h:2222", authorized_keys="/etc/ssh/keys"), "under /etc/ssh"),
    (dict(door="b", controller="op@h:2222", inherit_from="lab"), "cannot inherit from itself"),
    (dict(label="lab", env_label="other", door="b", controller="op@h:2222"), "two farm names"),
    (dict(controller="op@h:2222"), "the door .* needs deciding and there is no terminal"),
    (dict(door="b"), "the controller address workers dial needs deciding"),
])
def test_contradictions_and_undecidable_questions_are_refused_before_anything_is_written(box, flags, match):
    with pytest.raises(FdlError, match=match) as excinfo:
        box.prepare(**flags)
    refused(excinfo)
    assert not (box.root / ".fdl").exists() and box.observed == []  # refused before the host was even observed


def test_door_a_on_macos_is_refused(box):
    box.facts = replace(DEBIAN, system="Darwin")
    with pytest.raises(FdlError, match="builds on Linux only"):
        box.prepare(door="a", controller=f"fdl-lab@127.0.0.1:{box.door_port}", served=str(box.root),
                    assume_yes=True)


# --------------------------------------------------------------------------- permissions and credentials


def test_a_key_directory_open_to_others_is_fixed_with_yes(box):
    box.ak.parent.mkdir(mode=0o755)
    os.chmod(box.ak.parent, 0o755)
    report = box.run(controller=box.controller, assume_yes=True, install_key=True)
    issues = report.authorized_keys.permissions
    assert [i.path for i in issues] == [str(box.ak.parent)] and report.authorized_keys.permissions_fixed
    assert mode(box.ak.parent) == 0o700


def test_credentials_readable_by_others_are_refused_with_yes_or_without(box):
    box.run(controller=box.controller, assume_yes=True)
    os.chmod(box.farm / "token", 0o640)
    for flags in ({}, {"assume_yes": True}, {"assume_yes": True, "install_key": True}):
        with pytest.raises(FdlError, match="open to group or others") as refused:
            box.prepare(**flags)
        assert "--regen" in (refused.value.hint or "")
        assert mode(box.farm / "token") == 0o640


# --------------------------------------------------------------------------- apply's reports


def test_an_overlay_without_a_token_line_is_left_alone_and_a_snippet_written(box):
    overlay = box.root / "fdl.lab.yml"
    overlay.write_text("# mine\ncommands: {}\n")
    report = box.run(controller=box.controller, assume_yes=True, inherit_from="base")
    assert overlay.read_text() == "# mine\ncommands: {}\n"
    assert report.overlay.action == OverlayAction.SNIPPET and report.files.overlay_snippet == report.overlay.snippet
    token = (box.farm / "token").read_text().strip()
    snippet = Path(str(report.overlay.snippet))
    assert report.overlay.snippet_text == snippet.read_text() and token not in snippet.read_text()
    assert "token_file: .fdl/lab/token" in snippet.read_text()
    assert any("add 'inherit-from: base' yourself" in note for note in report.notes)


def test_an_overlay_that_holds_a_token_itself_is_moved_onto_the_token_file(box):
    """regression (issue 37, item 5): the overlay held the token, and a re-run only rewrote it in place."""
    overlay = box.root / "fdl.lab.yml"
    overlay.write_text('# mine\ncluster:\n  controller:\n    join:\n      token: "00ff"  # old\n')
    os.chmod(overlay, 0o644)
    report = box.run(controller=box.controller, assume_yes=True)
    assert overlay.read_text() == ("# mine\ncluster:\n  controller:\n    join:\n"
                                   "      token_file: .fdl/lab/token  # old\n")
    assert report.overlay.action == OverlayAction.TOKEN_REWRITTEN and mode(overlay) == 0o644
    assert any("others could read it" in note and "--regen" in note for note in report.notes)
    again = box.run()
    assert again.overlay.action == OverlayAction.UNCHANGED and "already names the farm's token file" in \
        again.overlay.message


def test_where_the_line_went_cannot_be_recorded_it_is_said_not_swallowed(box):
    """regression: an OSError writing installed-at was passed over in silence."""
    box.farm.mkdir(parents=True)
    (box.farm / "installed-at").mkdir()  # a directory where the record goes: opening it fails
    report = box.run(controller=box.controller, assume_yes=True, install_key=True)
    assert report.authorized_keys.action == KeyAction.ADDED
    assert any("could not record where" in note and str(box.ak) in note for note in report.notes)


def test_an_unreadable_key_file_is_said_not_swallowed(box):
    box.ak.parent.mkdir(mode=0o700)
    box.ak.mkdir()  # reading it fails with IsADirectoryError
    _, plan = box.prepare(controller=box.controller, assume_yes=True)
    assert plan.key_file.data is None
    assert any(note.startswith(f"could not read {box.ak}") for note in plan.notes)


def test_the_key_line_written_is_the_one_the_farm_key_identifies(box):
    report = box.run(controller=box.controller, assume_yes=True, install_key=True)
    _, plan = box.prepare()
    assert plan.existing is not None
    assert find_key(box.ak.read_bytes(), plan.existing.identity) == report.authorized_keys.line == 1


def test_a_key_file_the_role_refuses_is_the_wizards_refusal_with_the_farm_written(box):
    """The fdl_join_door role's module refuses (the key file is a directory): exit 1 with its reason, no traceback,
    the farm's own files already written and the key file as it was."""
    box.ak.parent.mkdir(mode=0o700)
    box.ak.mkdir()
    with pytest.raises(FdlError, match=r"the fdl_join_door role did not change .*is not a regular file") as excinfo:
        box.run(controller=box.controller, assume_yes=True, install_key=True)
    refused(excinfo)
    assert (box.farm / "key").is_file() and (box.farm / "join-door.yml").is_file()
    assert box.ak.is_dir() and list(box.ak.iterdir()) == []


def test_a_render_that_lost_a_key_stops_the_wizard_with_nothing_written(box, monkeypatch):
    """regression (issue 36, finding 1): worker.yml and the user-data came out with `identity:` inside the comment
    of the `ssh:` line, and the wizard wrote them and reported success. The real render runs; its worker.yml is
    then broken the way that template broke it (no shipped template can be made to do it any more)."""
    from dataclasses import replace as with_field

    from fdl.farm.wizard import files

    real = files.render

    def as_the_old_template_did(*args, **kwargs):
        done = real(*args, **kwargs)
        assert done.worker_yml is not None and "\n  identity:" in done.worker_yml
        return with_field(done, worker_yml=done.worker_yml.replace(
            "\n  identity:", "  # the door on the controller box  identity:"))

    monkeypatch.setattr(files, "render", as_the_old_template_did)
    with pytest.raises(FdlError, match=r"join\.identity missing \(lost or commented out\)") as excinfo:
        box.run(controller=box.controller, assume_yes=True, cloud_init=True)
    refused(excinfo)
    assert sorted(p.name for p in box.farm.iterdir()) == [".gitignore"]  # no key, token, worker.yml, user-data
    assert not (box.root / "fdl.lab.yml").exists()
    assert not (box.home / ".local" / "state" / "fdl" / "farms").exists() or \
        list((box.home / ".local" / "state" / "fdl" / "farms").iterdir()) == []  # nothing recorded as minted
