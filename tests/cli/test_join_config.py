"""`fdl join-config` from the command line: what a user runs, what they read, exit codes.

Every run has its own HOME (so ~/.ssh is a temp directory) and its own sshd
configuration for the doctor to read; nothing here touches the machine's
/etc/ssh or the real ~/.ssh.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import IN_CI, fdl_env, run_fdl
from tests.controller_util import free_port
from tests.runner_runs import runs_of

DOOR_PORT = free_port(pairs=False)  # nothing listens there when the tests start: they need no sshd
DOOR = f"op@127.0.0.1:{DOOR_PORT}"
FOREIGN = (b"# the operator's own keys\r\n"
           b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIForeignForeignForeignForeignForeignForeig01 me@laptop\r\n"
           b"\r\n"
           b'from="10.0.0.0/8",command="echo \\"hi there\\"" ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ== ci')


@pytest.fixture(scope="session")
def host_key(tmp_path_factory) -> Path:
    key = tmp_path_factory.mktemp("hostkey") / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


class Project:
    def __init__(self, root: Path, host_key: Path):
        self.root = root / "proj"
        self.home = root / "home"
        self.etc = root / "etc-ssh"
        for d in (self.root, self.home, self.etc / "sshd_config.d"):
            d.mkdir(parents=True)
        os.chmod(self.home, 0o755)
        self.sshd_config = self.etc / "sshd_config"
        self.sshd_config.write_text(f"Include {self.etc}/sshd_config.d/*.conf\nPort 22\nHostKey {host_key}\n"
                                    f"UsePAM no\nSubsystem sftp internal-sftp\n")
        (self.root / "fdl.yml").write_text("commands:\n  test:\n    run: 'true'\n")

    @property
    def farm(self) -> Path:
        return self.root / ".fdl"

    def ak(self) -> Path:
        return self.home / ".ssh" / "authorized_keys"

    @property
    def cache(self) -> Path:
        return self.home / ".cache"

    def run(self, *args: str, sshd: bool = True, input: str | None = None):
        extra = ["--sshd-config", str(self.sshd_config)] if sshd else []
        return run_fdl(*args, *extra, cwd=self.root, env={"HOME": str(self.home), "XDG_STATE_HOME": "",
                                                          "XDG_CACHE_HOME": str(self.cache)},
                       input=input, timeout=300)

    def json(self, *args: str):
        done = self.run(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done


@pytest.fixture
def proj(tmp_path, host_key) -> Project:
    return Project(tmp_path, host_key)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --------------------------------------------------------------------------- the scaffold


def test_scripted_first_run_writes_the_farm_and_reports(proj):
    (proj.root / "Cargo.toml").write_text('[package]\nname = "my-train"\n')
    done = proj.run("join-config", "b300", "--controller", DOOR, "--cloud-init", "--yes")
    assert done.returncode == 0, done.stderr
    farm = proj.farm / "b300"
    assert (farm / ".gitignore").read_text().splitlines()[-1] == "*"
    for name in ("key", "key.pub", "token", "worker.yml", "cloud-init.yml"):
        assert mode(farm / name) == 0o600, name
    assert mode(farm / "door-selftest.sh") == 0o755
    assert f"Match LocalPort {DOOR_PORT}" in (farm / "sshd-door.conf").read_text()
    assert "host doctor (before anything is written):" in done.stdout
    assert "setup on this box:" in done.stdout
    # the privileged part is one reviewable line: the fdl_join_door role with the variables the wizard wrote
    steps = [line.strip() for line in done.stdout.split("setup on this box:")[1].split("on each worker:")[0]
             .splitlines() if line.strip()]
    (privileged,) = [line for line in steps if "ansible-playbook" in line]
    assert privileged.endswith(" -i localhost, -c local flodl.fdl.join_door -e @.fdl/b300/join-door.yml --become")
    assert not any(line.startswith("sudo ") for line in steps), steps  # no list of sudo commands
    variables = yaml.safe_load((farm / "join-door.yml").read_text())
    assert variables["fdl_join_door_sshd_config_dir"] == str(proj.etc / "sshd_config.d")
    assert variables["fdl_join_door_sshd_config"] == str(proj.sshd_config)
    assert variables["fdl_join_door_public_key"] == (farm / "key.pub").read_text().strip()
    assert (variables["fdl_join_door_privileged"], variables["fdl_join_door_install_key"]) == (True, False)
    # the steps read the farm's files instead of repeating them, and end with the self-test
    assert steps[-1] == "sh .fdl/b300/door-selftest.sh"
    assert runs_of(proj.cache, "join_door.yml") == []  # without consent nothing outside the project changed
    token = (farm / "token").read_text().strip()
    assert token not in done.stdout and token not in done.stderr
    # --yes is not consent to edit authorized_keys
    assert not proj.ak().exists()
    assert "--yes does not count" in done.stderr


def test_the_overlay_is_a_working_env_with_a_cluster_command_named_after_the_crate(proj):
    (proj.root / "Cargo.toml").write_text('[package]\nname = "lib"\n[[bin]]\nname = "train"\n')
    assert proj.run("join-config", "b300", "--controller", DOOR, "--yes").returncode == 0
    shown = run_fdl("@b300", "config", "show", "--json", cwd=proj.root, env={"HOME": str(proj.home)})
    assert shown.returncode == 0, shown.stderr
    doc = yaml.safe_load((proj.root / "fdl.b300.yml").read_text())
    join = doc["cluster"]["controller"]["join"]
    assert join["discovery"] is True and join["start"] == "manual"
    # the overlay names the farm's 0600 token file and holds no secret (issue 37, item 5)
    assert join["token_file"] == ".fdl/b300/token" and "token" not in join
    assert (proj.farm / "b300" / "token").read_text().strip() not in (proj.root / "fdl.b300.yml").read_text()
    assert (proj.farm / ".gitignore").read_text().splitlines()[-1] == "*"
    assert "token_file" in json.loads(shown.stdout)["config"]["cluster"]["controller"]["join"]
    assert doc["commands"]["train"] == {"cluster": True, "build": "cargo build --release --bin train",
                                        "bin": "target/release/train"}


def test_without_a_crate_the_command_is_a_commented_placeholder_and_other_commands_warn(proj):
    assert proj.run("join-config", "b300", "--controller", DOOR, "--yes").returncode == 0
    text = (proj.root / "fdl.b300.yml").read_text()
    assert "commands" not in yaml.safe_load(text) and "#     cluster: true" in text
    ran = run_fdl("@b300", "test", cwd=proj.root, env={"HOME": str(proj.home)})
    assert ran.returncode == 0 and "not a cluster command" in ran.stderr


def test_json_twin_names_secrets_by_path_only(proj):
    doc, done = proj.json("join-config", "b300", "--controller", "fdl-b300@" + DOOR.split("@")[1], "--door", "a",
                          "--served", "/flodl/data", "--cloud-init", "--yes")
    farm = proj.farm / "b300"
    assert doc["door"] == "a" and doc["controller"]["door_port"] == DOOR_PORT
    assert doc["files"]["token"] == str(farm / "token") and doc["files"]["key"] == str(farm / "key")
    secret_key = (farm / "key").read_text()
    token = (farm / "token").read_text().strip()
    for secret in (token, secret_key.splitlines()[1]):
        assert secret not in done.stdout and secret not in done.stderr
    assert doc["steps"][-1]["command"] == "sh .fdl/b300/door-selftest.sh"
    assert {c["name"] for c in doc["doctor"]} >= {"sshd", "listener", "sftp", "served"}
    assert doc["authorized_keys"]["installed"] is False


def test_cloud_init_carries_the_farm_key_and_worker_config(proj):
    assert proj.run("join-config", "b300", "--controller", DOOR, "--door", "b", "--cloud-init", "--yes") \
        .returncode == 0
    farm = proj.farm / "b300"
    text = (farm / "cloud-init.yml").read_text()
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    files = {f["path"]: f for f in doc["write_files"]}
    assert files["/etc/fdl/b300/key"]["content"] == (farm / "key").read_text()
    worker = yaml.safe_load(files["/etc/fdl/b300/fdl.yml"]["content"])
    assert worker["join"]["ssh"] == DOOR and worker["join"]["source"] == f"rsync://op@127.0.0.1:{DOOR_PORT}:/tree"
    assert "RestartPreventExitStatus=2" in files["/etc/systemd/system/flodl-join.service"]["content"]
    assert "rsync" in doc["packages"]
    # the agent's account owns its secrets; they are written once cloud-init created it
    assert {"name": "flodl", "gecos": "fdl join agent", "shell": "/usr/sbin/nologin", "lock_passwd": True} \
        in doc["users"]
    for path in ("/etc/fdl/b300/key", "/etc/fdl/b300/fdl.yml", "/etc/fdl/b300/token"):
        assert files[path]["owner"] == "flodl:flodl" and files[path]["defer"] is True
    assert doc["runcmd"][-1] == ["systemctl", "enable", "--now", "flodl-join.service"]


def test_cloud_init_unit_is_the_shipped_template_and_systemd_accepts_it(proj, tmp_path):
    """One source of truth: the unit in the user-data is templates/fdl-join.service.j2 as Ansible renders it."""
    from tests.unit.templates.test_join_unit import render as ansible_render

    assert proj.run("join-config", "b300", "--controller", DOOR, "--cloud-init", "--yes").returncode == 0
    doc = yaml.safe_load((proj.farm / "b300" / "cloud-init.yml").read_text())
    (unit,) = [f["content"] for f in doc["write_files"] if f["path"] == "/etc/systemd/system/flodl-join.service"]
    ansible_render(tmp_path, fdl_join_exec="/usr/bin/env fdl", fdl_join_user="flodl", fdl_join_workdir="/etc/fdl/b300")
    by_ansible = (tmp_path / "fdl-join.service").read_text()
    body = lambda text: [line for line in text.splitlines() if not line.startswith("#")]  # noqa: E731 - headers differ
    assert body(unit) == body(by_ansible)
    lines = body(unit)
    for line in ("StartLimitIntervalSec=0", "Restart=always", "RestartPreventExitStatus=2",
                 "WorkingDirectory=/etc/fdl/b300", "ExecStart=/usr/bin/env fdl join --persist", "User=flodl"):
        assert line in lines
    assert not any(line.startswith("StateDirectory=") for line in lines)  # /etc/fdl/b300 is not under /var/lib
    path = tmp_path / "flodl-join.service"
    path.write_text(unit)
    done = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "flodl-join.service" not in done.stderr, done.stderr


def test_the_roles_render_every_file_and_no_sshd_t_runs_outside_their_validate(proj, host_key):
    """regression (issue 39, item 4): join-config rendered the roles' templates with a jinja2 environment of its
    own (with copies of Ansible's comment and bool filters) and ran its own sshd -t beside the role's validate:.
    Now one ansible-playbook run, the collection's join_config play, renders them: the fdl_join_door role's
    module plans the drop-in, and the templates are Ansible's; the doctor has no sshd -t finding of its own."""
    doc, _ = proj.json("join-config", "b300", "--controller", DOOR, "--cloud-init", "--yes")
    (run,) = runs_of(proj.cache, "join_config.yml")
    assert run.command[0] == "ansible-playbook"
    assert "flodl.fdl.fdl_join_door_plan" in run.actions and "ansible.builtin.set_fact" in run.actions
    assert run.hosts("failures") == {} and run.hosts("changed") == {"localhost": 1}  # the user-data, privately
    assert "sshd -t" not in {check["name"] for check in doc["doctor"]}
    assert runs_of(proj.cache, "join_door.yml") == []
    token = (proj.farm / "b300" / "token").read_text().strip()
    key_line = (proj.farm / "b300" / "key").read_text().splitlines()[1]
    for artifact in run.artifact_dir.rglob("*"):  # no secret in the runner's artifacts
        if artifact.is_file():
            text = artifact.read_text(errors="replace")
            assert token not in text and key_line not in text, artifact


# --------------------------------------------------------------------------- what a worker boots from


DOORS = {
    "a": ("fdl-b300@127.0.0.1:{port}", {"data_source": "sshfs://fdl-b300@127.0.0.1:{port}:/data",
                                        "data_path": "{served}"}),
    "b": ("op@127.0.0.1:{port}", {"source": "rsync://op@127.0.0.1:{port}:/tree"}),
    "tunnel-only": ("op@127.0.0.1:{port}", {}),
}


@pytest.mark.parametrize("door", list(DOORS))
def test_every_key_reads_back_from_worker_yml_and_from_the_user_data_for_every_door(proj, host_key, door):
    """regression (issue 36, findings 1 and 2): `identity:` landed inside the comment of the `ssh:` line (every
    door, worker.yml and the fdl.yml inside cloud-init.yml), and the user-data pinned no door host key, so a
    booted worker found no known_hosts entry for its door and exited 2."""
    served = proj.root / "served"
    served.mkdir()
    controller, extra = DOORS[door]
    args = ["join-config", "b300", "--door", door, "--controller", controller.format(port=DOOR_PORT),
            "--cloud-init", "--yes"] + (["--served", str(served)] if door != "tunnel-only" else [])
    done = proj.run(*args)
    assert done.returncode == 0, done.stderr
    farm = proj.farm / "b300"
    pin = host_key.with_suffix(".pub").read_text().split()
    known = f"[127.0.0.1]:{DOOR_PORT} {pin[0]} {pin[1]}"
    want = {"controller": "127.0.0.1:1337", "ssh": controller.format(port=DOOR_PORT),
            "identity": "/etc/fdl/b300/key", "known_hosts": "/etc/fdl/b300/known_hosts",
            "token_file": "/etc/fdl/b300/token", "persist": True,
            **{k: v.format(port=DOOR_PORT, served=served) for k, v in extra.items()}}
    worker_yml = (farm / "worker.yml").read_text()
    assert yaml.safe_load(worker_yml) == {"join": want}
    assert (farm / "known_hosts").read_text() == known + "\n"
    user_data = (farm / "cloud-init.yml").read_text()
    doc = yaml.safe_load(user_data)
    files = {f["path"]: f for f in doc["write_files"]}
    assert files["/etc/fdl/b300/fdl.yml"]["content"] == worker_yml  # the very file, byte for byte
    assert files["/etc/fdl/b300/known_hosts"]["content"] == known + "\n"
    assert files["/etc/fdl/b300/known_hosts"]["permissions"] == "0644"
    assert files["/etc/fdl/b300/key"]["content"] == (farm / "key").read_text()
    assert files["/etc/fdl/b300/token"]["content"] == (farm / "token").read_text()
    assert (files["/etc/fdl/b300/token"]["owner"], files["/etc/fdl/b300/token"]["permissions"]) == \
        ("flodl:flodl", "0600")
    assert "WorkingDirectory=/etc/fdl/b300" in files["/etc/systemd/system/flodl-join.service"]["content"]
    # the shape re-runs recover the farm from
    assert f"# fdl-farm-shape: door={door}" in worker_yml
    # cloud-init's own schema accepts the user-data (it must be installed under CI: scripts/apt-test.txt)
    if shutil.which("cloud-init") is None:
        if IN_CI:
            pytest.fail("cloud-init is not installed (scripts/apt-test.txt lists it)")
    else:
        schema = subprocess.run(["cloud-init", "schema", "--config-file", str(farm / "cloud-init.yml")],
                                capture_output=True, text=True, timeout=120)
        assert schema.returncode == 0, schema.stderr + schema.stdout


def test_user_data_without_a_readable_door_host_key_is_refused_with_nothing_written(proj, tmp_path):
    """A booted worker would find no known_hosts entry for its door and stop for good: join-config refuses."""
    proj.sshd_config.write_text(proj.sshd_config.read_text().replace("HostKey ", f"HostKey {tmp_path}/none #"))
    done = proj.run("join-config", "b300", "--controller", DOOR, "--cloud-init", "--yes")
    assert done.returncode == 1 and "the door's host keys cannot be read" in done.stderr
    assert "Nothing was written" in done.stderr and not proj.farm.exists()
    plain = proj.run("join-config", "b300", "--controller", DOOR, "--yes")  # without user-data: a warning
    assert plain.returncode == 0 and "workers could not pin the door" in plain.stdout
    assert "known_hosts" not in yaml.safe_load((proj.farm / "b300" / "worker.yml").read_text())["join"]


def test_the_worker_yml_is_what_fdl_join_reads(proj, tmp_path):
    """The farm's worker.yml, installed where it says with its token, key and known_hosts, is a configuration
    `fdl join` takes: every path it names resolves there and the token is read from its file."""
    assert proj.run("join-config", "b300", "--controller", DOOR, "--yes").returncode == 0
    farm = proj.farm / "b300"
    where = tmp_path / "etc-fdl-b300"
    where.mkdir()
    text = (farm / "worker.yml").read_text().replace("/etc/fdl/b300/", f"{where}/")
    (where / "fdl.yml").write_text(text)
    for name in ("key", "token", "known_hosts"):
        (where / name).write_bytes((farm / name).read_bytes())
        os.chmod(where / name, 0o600)
    shown = run_fdl("config", "show", "--json", cwd=where, env={"HOME": str(proj.home)})
    assert shown.returncode == 0, shown.stderr
    join = json.loads(shown.stdout)["config"]["join"]
    assert join["identity"] == f"{where}/key" and join["known_hosts"] == f"{where}/known_hosts"
    os.chmod(where / "token", 0o644)
    refused = run_fdl("config", "show", cwd=where, env={"HOME": str(proj.home)})
    assert refused.returncode == 1 and "group or others may read or change it" in refused.stderr


# --------------------------------------------------------------------------- re-runs


def test_rerun_reuses_credentials_and_recovers_the_farm_shape(proj):
    proj.json("join-config", "b300", "--door", "tunnel-only", "--controller", "op@10.9.8.7:2299",
                         "--port", "1400", "--yes")
    farm = proj.farm / "b300"
    key, token, overlay = (farm / "key").read_bytes(), (farm / "token").read_bytes(), \
        (proj.root / "fdl.b300.yml").read_bytes()
    again, _ = proj.json("join-config", "b300", "--yes")
    assert again["door"] == "tunnel-only" and again["controller"]["ssh"] == "op@10.9.8.7:2299"
    assert again["controller"]["training_port"] == 1400
    assert again["shape_from"]["door"] == "worker yml" and again["shape_from"]["controller"] == "worker yml"
    assert again["credentials"]["action"] == "reused"
    assert (farm / "key").read_bytes() == key and (farm / "token").read_bytes() == token
    assert (proj.root / "fdl.b300.yml").read_bytes() == overlay
    assert again["overlay"]["action"] == "unchanged"
    changed, _ = proj.json("join-config", "b300", "--door", "b", "--yes")
    assert changed["door"] == "b" and changed["controller"]["ssh"] == "op@10.9.8.7:2299"


def test_regen_rotates_key_and_token_and_leaves_the_overlay_alone(proj):
    assert proj.run("join-config", "b300", "--controller", DOOR, "--yes").returncode == 0
    overlay = proj.root / "fdl.b300.yml"
    edited = overlay.read_bytes().replace(b"\n", b"\r\n") + b"# my own note\r\n"
    edited = edited.replace(b"window_s: 600", b"window_s: 900")
    overlay.write_bytes(edited)
    farm = proj.farm / "b300"
    old_pub, old_token = (farm / "key.pub").read_text(), (farm / "token").read_text().strip()
    done = run_fdl("@b300", "join-config", "--regen", "--yes", "--sshd-config", str(proj.sshd_config),
                   cwd=proj.root, env={"HOME": str(proj.home)})
    assert done.returncode == 0, done.stderr
    new_token = (farm / "token").read_text().strip()
    assert new_token != old_token and (farm / "key.pub").read_text() != old_pub
    assert overlay.read_bytes() == edited  # it names the token file; the rotation changed that file alone
    assert "credentials: rotated" in done.stdout


def test_two_names_for_the_farm_is_a_refusal(proj):
    done = run_fdl("@b300", "join-config", "other", "--yes", cwd=proj.root, env={"HOME": str(proj.home)})
    assert done.returncode == 1 and "two farm names" in done.stderr


def test_a_hand_written_overlay_without_token_is_never_edited(proj):
    overlay = proj.root / "fdl.b300.yml"
    mine = b"# written by hand\ncluster:\n  controller: 10.0.0.1:1337\n"
    overlay.write_bytes(mine)
    doc, _ = proj.json("join-config", "b300", "--controller", DOOR, "--yes")
    assert overlay.read_bytes() == mine
    assert doc["overlay"]["action"] == "snippet"
    snippet = Path(doc["overlay"]["snippet"])
    token = (proj.farm / "b300" / "token").read_text().strip()
    assert "token_file: .fdl/b300/token" in snippet.read_text() and token not in snippet.read_text()
    human = proj.run("join-config", "b300", "--yes")
    assert human.returncode == 0 and overlay.read_bytes() == mine
    assert "token_file: .fdl/b300/token" in human.stdout  # the snippet, printed: it holds no secret
    assert token not in human.stdout


# --------------------------------------------------------------------------- refusals (exit 1)


@pytest.mark.parametrize("args, says", [
    (["join-config", "lab"], "no terminal to ask on"),
    (["join-config"], "name the farm"),
    (["join-config", "lab", "--door", "tunnel-only", "--served", "/srv", "--controller", DOOR], "serves nothing"),
    (["join-config", "lab", "--authorized-keys", "/etc/ssh/authorized_keys.d/op", "--install-key", "--yes"],
     "/etc/ssh"),
    (["join-config", "lab", "--authorized-keys", "/tmp/x", "--no-install-key", "--yes"], "contradict each other"),
    (["join-config", "lab", "--install-key", "--no-install-key", "--yes"], "contradict each other"),
    (["join-config", "lab", "--controller", "op@127.0.0.1:22", "--yes"], "cannot be port 22"),
    (["join-config", "lab", "--controller", "op@127.0.0.1:1337", "--yes"], "must differ"),
    (["join-config", "lab", "--inherit-from", "lab", "--yes"], "inherit from itself"),
    (["join-config", "lab", "--controller", "b@d user@h", "--yes"], "not a login name"),
])
def test_refusals_exit_1_and_write_nothing(proj, args, says):
    done = proj.run(*args)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert not proj.farm.exists() and not (proj.root / "fdl.lab.yml").exists()


# --------------------------------------------------------------------------- authorized_keys


def test_install_key_creates_ssh_dir_and_keeps_foreign_lines(proj):
    done = proj.run("join-config", "b300", "--controller", DOOR, "--door", "tunnel-only", "--install-key")
    assert done.returncode == 0, done.stderr
    # the line went in through ansible-playbook running the fdl_join_door role here, its key part only
    (run,) = runs_of(proj.cache, "join_door.yml")
    assert run.command[0] == "ansible-playbook"
    assert "flodl.fdl.fdl_authorized_key" in run.actions and "ansible.builtin.template" in run.actions
    assert set(run.hosts("ok")) == {"localhost"} and run.hosts("failures") == {}
    assert run.hosts("changed") == {"localhost": 1}  # the key file, and nothing of the privileged part
    ak = proj.ak()
    assert mode(ak.parent) == 0o700 and mode(ak) == 0o600
    line = (proj.farm / "b300" / "authorized_keys.line").read_bytes()
    assert ak.read_bytes() == line
    assert f"nothing listens on 127.0.0.1:{DOOR_PORT} yet" in done.stderr

    ak.write_bytes(FOREIGN + b"\r\n" + line.rstrip(b"\n") + b"\r\n# after\r\n")
    again = proj.run("join-config", "b300", "--install-key")
    assert again.returncode == 0 and "authorized_keys: unchanged" in again.stdout
    assert ak.read_bytes() == FOREIGN + b"\r\n" + line.rstrip(b"\n") + b"\r\n# after\r\n"


def test_regen_needs_consent_to_replace_the_installed_line(proj):
    assert proj.run("join-config", "b300", "--controller", DOOR, "--door", "b", "--install-key").returncode == 0
    ak = proj.ak()
    ak.write_bytes(FOREIGN + b"\n" + ak.read_bytes())
    before = ak.read_bytes()
    farm = proj.farm / "b300"
    token = (farm / "token").read_bytes()
    refused = proj.run("join-config", "b300", "--regen", "--yes")
    assert refused.returncode == 1 and "--yes does not give it" in refused.stderr
    assert ak.read_bytes() == before and (farm / "token").read_bytes() == token
    done = proj.run("join-config", "b300", "--regen", "--install-key")
    assert done.returncode == 0, done.stderr
    after = ak.read_bytes()
    assert after.startswith(FOREIGN + b"\n")
    assert after[len(FOREIGN) + 1:] == (farm / "authorized_keys.line").read_bytes()
    assert (farm / "token").read_bytes() != token


def test_loose_permissions_are_reported_and_fixed_only_on_confirm(proj):
    ssh = proj.home / ".ssh"
    ssh.mkdir()
    os.chmod(ssh, 0o775)
    proj.ak().write_bytes(FOREIGN)
    os.chmod(proj.ak(), 0o664)
    refused = proj.run("join-config", "b300", "--controller", DOOR, "--door", "b", "--install-key")
    assert refused.returncode == 1
    assert f"chmod 700 {ssh}" in refused.stderr and f"chmod 600 {proj.ak()}" in refused.stderr
    assert mode(ssh) == 0o775 and not proj.farm.exists()
    done = proj.run("join-config", "b300", "--controller", DOOR, "--door", "b", "--install-key", "--yes")
    assert done.returncode == 0, done.stderr
    assert mode(ssh) == 0o700 and mode(proj.ak()) == 0o600
    assert f"chmod 700 {ssh}" in done.stdout and "[fixed]" in done.stdout
    assert proj.ak().read_bytes().startswith(FOREIGN)


def test_explicit_key_file_leaves_its_directory_exactly_as_found(proj, tmp_path):
    layout = tmp_path / "container-keys"
    layout.mkdir()
    os.chmod(layout, 0o751)
    target = layout / "authorized_keys"
    target.write_bytes(FOREIGN)
    os.chmod(target, 0o600)
    before = (sorted(p.name for p in layout.iterdir()), mode(layout), layout.stat().st_uid)
    done = proj.run("join-config", "b300", "--controller", DOOR, "--door", "b", "--install-key",
                    "--authorized-keys", str(target))
    assert done.returncode == 0, done.stderr
    assert (sorted(p.name for p in layout.iterdir()), mode(layout), layout.stat().st_uid) == before
    assert target.read_bytes().startswith(FOREIGN) and not proj.ak().exists()
    missing = proj.run("join-config", "b300", "--install-key", "--authorized-keys", str(tmp_path / "no" / "ak"))
    assert missing.returncode == 1 and "leaves that directory to you" in missing.stderr
    assert not (tmp_path / "no").exists()


# --------------------------------------------------------------------------- interactive


def test_prompts_offer_defaults_on_a_terminal(proj):
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(sys.executable, ["-m", "fdl", "join-config", "b300", "--sshd-config",
                                           str(proj.sshd_config)], cwd=str(proj.root),
                          env=fdl_env({"HOME": str(proj.home)}), encoding="utf-8", timeout=60)
    try:
        child.expect(r"Door.*\[b\]")
        child.sendline("tunnel-only")
        child.expect(r"Controller as workers reach its door.*\[")
        child.sendline(DOOR)
        child.expect(r"host doctor")
        child.expect(r"Install the door's key line into .*\[y/N\]")
        child.sendline("y")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    assert proj.ak().read_bytes() == (proj.farm / "b300" / "authorized_keys.line").read_bytes()
    # a re-run asks whether to keep the credentials (default: keep) and nothing about a line already in place
    child = pexpect.spawn(sys.executable, ["-m", "fdl", "join-config", "b300", "--sshd-config",
                                           str(proj.sshd_config)], cwd=str(proj.root),
                          env=fdl_env({"HOME": str(proj.home)}), encoding="utf-8", timeout=60)
    try:
        child.expect(r"Keep them\?.*\[Y/n\]")
        child.sendline("")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "Install the door's key line" not in child.before
    assert "credentials: reused" in child.before
    # answering no rotates both, and the installed old line is replaced once confirmed
    old_line = proj.ak().read_bytes()
    child = pexpect.spawn(sys.executable, ["-m", "fdl", "join-config", "b300", "--sshd-config",
                                           str(proj.sshd_config)], cwd=str(proj.root),
                          env=fdl_env({"HOME": str(proj.home)}), encoding="utf-8", timeout=60)
    try:
        child.expect(r"Keep them\?.*\[Y/n\]")
        child.sendline("n")
        child.expect(r"Replace the old farm key line in .* \(line 1\) with the new key\?.*\[Y/n\]")
        child.sendline("")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0 and "credentials: rotated" in child.before
    assert proj.ak().read_bytes() != old_line
    assert proj.ak().read_bytes() == (proj.farm / "b300" / "authorized_keys.line").read_bytes()


# --------------------------------------------------------------------------- credentials found on disk


def _copied_farm(proj) -> Path:
    """A farm directory as a clone or a copy leaves it: made by the wizard, then its files opened to everyone."""
    assert proj.run("join-config", "b300", "--controller", DOOR, "--yes").returncode == 0
    farm = proj.farm / "b300"
    for name in ("key", "key.pub", "token"):
        os.chmod(farm / name, 0o644)
    return farm


def test_credentials_readable_by_others_are_refused_and_never_narrowed_even_with_yes(proj):
    """regression: planted 0644 credentials were made 0600 under --yes and reused (`credentials: reused`), the
    token stamped into the overlay and worker.yml."""
    farm = _copied_farm(proj)
    for extra in ((), ("--yes",), ("--yes", "--install-key")):
        done = proj.run("join-config", "b300", *extra)
        assert done.returncode == 1, done.stdout
        assert "open to group or others" in done.stderr and f"{farm / 'key'} is 0644" in done.stderr
        assert "--regen" in done.stderr and "chmod 600" not in done.stderr
        assert all(mode(farm / n) == 0o644 for n in ("key", "key.pub", "token"))  # nothing was changed
    assert "fdl-farm-b300" not in (proj.ak().read_text() if proj.ak().exists() else "")
    regen, _ = proj.json("join-config", "b300", "--regen", "--yes")
    assert regen["credentials"]["action"] == "rotated"  # the foreign pair is replaced, not reused
    assert all(mode(farm / n) == 0o600 for n in ("key", "key.pub", "token"))


def _plant(proj, farm: Path, other_home: Path) -> tuple[bytes, bytes]:
    """Credentials minted by fdl for someone else (another HOME: another user's state), copied in as they are."""
    other = other_home / "proj"
    other.mkdir(parents=True)
    (other / "fdl.yml").write_text("commands:\n  test:\n    run: 'true'\n")
    made = run_fdl("join-config", "b300", "--controller", DOOR, "--yes", "--sshd-config", str(proj.sshd_config),
                   cwd=other, env={"HOME": str(other_home), "XDG_STATE_HOME": ""})
    assert made.returncode == 0, made.stderr
    farm.mkdir(parents=True, exist_ok=True)
    for name in ("key", "key.pub", "token"):
        (farm / name).write_bytes((other / ".fdl" / "b300" / name).read_bytes())
        os.chmod(farm / name, 0o600)
    return (farm / "key").read_bytes(), (farm / "token").read_bytes()


def test_credentials_tracked_by_git_are_refused(proj, tmp_path):
    """regression: a project cloned with a force-added .fdl/LABEL/ (someone else's key pair and a token they know)
    had its credentials reused, and with --install-key their key opened the door."""
    farm = proj.farm / "b300"
    key, token = _plant(proj, farm, tmp_path / "someone-else")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x",
           "GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x"}
    for argv in (["init", "-q"], ["add", "-f", ".fdl/b300/key", ".fdl/b300/key.pub", ".fdl/b300/token"],
                 ["commit", "-qm", "farm"]):
        subprocess.run(["git", "-C", str(proj.root), *argv], check=True, env=env, capture_output=True)
    done = proj.run("join-config", "b300", "--controller", DOOR, "--yes", "--install-key")
    assert done.returncode == 1, done.stdout
    assert "tracked by git" in done.stderr and f"{farm / 'key'}" in done.stderr and "--regen" in done.stderr
    assert (farm / "key").read_bytes() == key and (farm / "token").read_bytes() == token
    assert not proj.ak().exists() or "fdl-farm-b300" not in proj.ak().read_text()
    assert not (proj.root / "fdl.b300.yml").exists()


def test_credentials_minted_elsewhere_are_refused_even_when_private_and_untracked(proj, tmp_path):
    """A copied farm directory (0600, untracked, owned by this user) is still not this user's minting here."""
    farm = proj.farm / "b300"
    _plant(proj, farm, tmp_path / "someone-else")
    done = proj.run("join-config", "b300", "--controller", DOOR, "--yes")
    assert done.returncode == 1, done.stdout
    assert "were not minted by fdl for you on this box" in done.stderr and "no record" in done.stderr
    assert "--regen" in done.stderr


def test_a_minted_pair_is_recorded_privately_and_reused_silently(proj):
    first, _ = proj.json("join-config", "b300", "--controller", DOOR, "--yes")
    state = proj.home / ".local" / "state" / "fdl" / "farms"
    records = list(state.iterdir())
    assert len(records) == 1 and mode(records[0]) == 0o600
    assert mode(state) == 0o700 and mode(state.parent) == 0o700
    record = json.loads(records[0].read_text())
    assert record["fingerprint"] == first["credentials"]["fingerprint"]
    token = (proj.farm / "b300" / "token").read_text().strip()
    assert token not in records[0].read_text() and record["token_sha256"] != token
    again, done = proj.json("join-config", "b300", "--yes")
    assert again["credentials"]["action"] == "reused" and done.stderr.count("credential") == 0
    # the token changed behind fdl's back (a planted one): the record no longer matches
    (proj.farm / "b300" / "token").write_text("".join(reversed(token)) + "\n")
    refused = proj.run("join-config", "b300", "--yes")
    assert refused.returncode == 1 and "the token is not the one fdl minted" in refused.stderr
    rotated, _ = proj.json("join-config", "b300", "--regen", "--yes")
    assert rotated["credentials"]["action"] == "rotated"
    assert [p.name for p in state.iterdir()] != [records[0].name] and len(list(state.iterdir())) == 1


@pytest.mark.parametrize("token, says", [
    ("0" * 64, "only 1 distinct digits"),
    ("0123456789abcdef" * 4, "repeats a 16-digit pattern"),
    ("ab" * 16, "not 64 lowercase hex digits"),
    ("F" * 64, "not 64 lowercase hex digits"),
])
def test_a_found_token_fdl_would_never_mint_is_refused(proj, token, says):
    """regression: an all-zero token found in .fdl/<label>/ was installed and used."""
    assert proj.run("join-config", "b300", "--controller", DOOR, "--yes").returncode == 0
    (proj.farm / "b300" / "token").write_text(token + "\n")
    done = proj.run("join-config", "b300", "--yes")
    assert done.returncode == 1 and says in done.stderr and "--regen" in done.stderr
    regen = proj.run("join-config", "b300", "--regen", "--yes")
    assert regen.returncode == 0, regen.stderr
    assert (proj.farm / "b300" / "token").read_text().strip() != token


def _swap_key(farm: Path, *keygen: str) -> None:
    for name in ("key", "key.pub"):
        (farm / name).unlink()
    subprocess.run(["ssh-keygen", "-q", *keygen, "-N", "", "-f", str(farm / "key")], check=True)
    os.chmod(farm / "key.pub", 0o600)


@pytest.mark.parametrize("case, says", [
    ("rsa-2048", "2048-bit RSA key, too weak"),
    ("mismatch", "are not one key pair"),
    ("passphrase", "not an unencrypted OpenSSH private key"),
])
def test_a_found_key_that_is_weak_or_not_one_pair_is_refused(proj, tmp_path, case, says):
    assert proj.run("join-config", "b300", "--controller", DOOR, "--yes").returncode == 0
    farm = proj.farm / "b300"
    if case == "rsa-2048":
        _swap_key(farm, "-t", "rsa", "-b", "2048")
    elif case == "mismatch":
        other = tmp_path / "other"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
        (farm / "key.pub").write_text((other.with_suffix(".pub")).read_text())
    else:
        (farm / "key").unlink()
        (farm / "key.pub").unlink()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret words", "-f", str(farm / "key")],
                       check=True)
        os.chmod(farm / "key.pub", 0o600)
    done = proj.run("join-config", "b300", "--yes")
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert "--regen" in done.stderr


def test_credentials_owned_by_someone_else_are_refused(proj):
    from tests.conftest import need_root_or_skip

    need_root_or_skip("gives the token file to another user")
    assert proj.run("join-config", "b300", "--controller", DOOR, "--yes").returncode == 0
    token = proj.farm / "b300" / "token"
    os.chown(token, 65534, 65534)
    done = proj.run("join-config", "b300", "--yes")
    # refused as soon as discovery finds it: another account's file in the project's .fdl/ (fdl.hostside.trust)
    assert done.returncode == 1 and f"{token} is owned by nobody (uid 65534)" in done.stderr


def test_an_old_overlay_holding_the_token_is_moved_onto_the_token_file_and_rotation_never_touches_it(proj):
    """regression (issue 37, item 5): the overlay held the token, and --regen wrote the new one into it."""
    assert proj.run("join-config", "b300", "--controller", DOOR, "--yes").returncode == 0
    overlay = proj.root / "fdl.b300.yml"
    token = (proj.farm / "b300" / "token").read_text().strip()
    old = overlay.read_text().replace("token_file: .fdl/b300/token", f'token: "{token}"')
    overlay.write_text(old)  # what an fdl from before token_file: wrote
    os.chmod(overlay, 0o644)
    warned = run_fdl("@b300", "config", "show", cwd=proj.root, env={"HOME": str(proj.home)})
    assert warned.returncode == 0 and "holds a literal join token" in warned.stderr and token not in warned.stderr
    doc, done = proj.json("join-config", "b300", "--yes")
    assert doc["overlay"]["action"] == "token-rewritten"
    assert overlay.read_text() == old.replace(f'token: "{token}"', "token_file: .fdl/b300/token")
    assert "others could read it" in done.stderr and "--regen" in done.stderr
    before = overlay.read_bytes()
    rotated, _ = proj.json("join-config", "b300", "--regen", "--yes")
    assert rotated["overlay"]["action"] == "unchanged" and overlay.read_bytes() == before
    shown = run_fdl("@b300", "config", "show", cwd=proj.root, env={"HOME": str(proj.home)})
    assert shown.returncode == 0 and "literal join token" not in shown.stderr


def test_door_a_logs_workers_in_as_its_jailed_account_never_the_operators(proj):
    """regression: door a's key went into the operator's own key file, where its sftp read anything."""
    refused = proj.run("join-config", "b300", "--controller", DOOR, "--door", "a", "--yes")
    assert refused.returncode == 1 and "jailed account fdl-b300" in refused.stderr
    assert "--controller fdl-b300@" in refused.stderr
    doc, _ = proj.json("join-config", "b300", "--controller", DOOR.split("@")[1], "--door", "a", "--yes",
                       "--jail-dir", "/srv/fdl")
    assert doc["controller"]["user"] == "fdl-b300"
    assert doc["authorized_keys"]["action"] == "jailed"
    assert doc["authorized_keys"]["path"] == "/srv/fdl/b300/.ssh/authorized_keys"
    commands = " ; ".join(s["command"] or "" for s in doc["steps"])
    (privileged,) = [s for s in doc["steps"] if "ansible-playbook" in (s["command"] or "")]
    assert "the door's own account fdl-b300" in privileged["title"]
    assert "/flodl/data bound read-only at /srv/fdl/b300/jail/data" in privileged["title"]
    assert privileged["command"].endswith("flodl.fdl.join_door -e @.fdl/b300/join-door.yml --become")
    variables = yaml.safe_load((proj.farm / "b300" / "join-door.yml").read_text())
    assert (variables["fdl_join_door_door"], variables["fdl_join_door_jail_base"]) == ("a", "/srv/fdl")
    assert "install --install-key" not in commands and "fdl join-config b300 --install-key" not in commands
    worker = yaml.safe_load((proj.farm / "b300" / "worker.yml").read_text())["join"]
    assert worker["data_source"] == f"sshfs://fdl-b300@127.0.0.1:{DOOR_PORT}:/data"
    assert worker["data_path"] == "/flodl/data"
    dropin = (proj.farm / "b300" / "sshd-door.conf").read_text()
    assert "Match User fdl-b300" in dropin and "ChrootDirectory /srv/fdl/b300/jail" in dropin
    again, _ = proj.json("join-config", "b300", "--yes")  # the re-run recovers the jail from worker.yml
    assert again["authorized_keys"]["path"] == "/srv/fdl/b300/.ssh/authorized_keys"


def test_a_farm_key_left_in_the_operators_file_is_refused_for_door_a_until_removed(proj):
    """regression: an unconfined door-a line (the farm key in the operator's own file) must not silently stay."""
    assert proj.run("join-config", "b300", "--controller", DOOR, "--door", "b", "--install-key").returncode == 0
    assert "fdl-farm-b300" in proj.ak().read_text()
    stale = proj.ak().read_text().splitlines().index(
        next(ln for ln in proj.ak().read_text().splitlines() if "fdl-farm-b300" in ln)) + 1
    refused = proj.run("join-config", "b300", "--controller", DOOR.split("@")[1], "--door", "a", "--yes")
    assert refused.returncode == 1, refused.stderr
    assert f"line {stale} lets the farm key" in refused.stderr and "--install-key to remove it" in refused.stderr
    assert "fdl-farm-b300" in proj.ak().read_text()  # refused: nothing changed
    doc, done = proj.json("join-config", "b300", "--controller", DOOR.split("@")[1], "--door", "a", "--yes",
                          "--install-key")
    assert doc["authorized_keys"]["removed_unconfined"]["line"] == stale
    assert "fdl-farm-b300" not in proj.ak().read_text()
    assert "removed the farm key" in done.stderr
