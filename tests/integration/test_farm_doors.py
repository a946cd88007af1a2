"""Every farm door against a real sshd on loopback, with the key the wizard generated.

The wizard runs as a user would (`fdl join-config ... --install-key`: its key
line goes in through the fdl_join_door role), the drop-in (and door a's
account, jail and bind) is installed and sshd reloaded by running the very
privileged line its report prints (the same role, as root), and then real
ssh, sftp and rsync clients knock on the door: a shell is refused everywhere;
door a opens a read-only sftp session; door b lists the served tree through
rrsync and refuses writes and paths outside it; every door forwards to the
controller port and refuses any other forward. The wizard's own door
self-test must pass too. Door b is opened a second time for each of Debian
12's rsync releases (3.2.7 and 3.5.0, unpacked from their packages): a link
out of the served tree must give nothing on either, whatever the client asks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import need_root_or_skip, run_fdl
from tests.integration.debian_rsync import RELEASES, unpack_rrsync
from tests.integration.loopback_sshd import Listener, LoopbackSshd, free_ports

pytestmark = pytest.mark.slow
MARKER = "fdl-shell-ran-here"


@dataclass
class Door:
    door: str
    sshd: LoopbackSshd
    project: Path
    home: Path
    farm: Path
    door_port: int
    controller_port: int
    served: Path | None
    report: dict
    listener: Listener

    @property
    def key(self) -> Path:
        return self.farm / "key"

    @property
    def user(self) -> str:
        """Who the farm key logs in as: door a's jailed account, else the operator's own."""
        return self.report["controller"]["user"]

    @property
    def jail(self) -> Path:
        return _jail_base(self.sshd) / "lab"

    def ssh(self, *args: str, key: Path | None = None, port: int | None = None, input: str | None = None,
            user: str | None = None):
        return self.sshd.ssh(key or self.key, port or self.door_port, "-l", user or self.user, *args, input=input)

    def wizard(self, *args: str):
        return run_fdl("join-config", "lab", "--sshd-config", str(self.sshd.config), "--authorized-keys",
                       str(self.sshd.authorized_keys), *args, cwd=self.project, env={"HOME": str(self.home)})


def _run_step(door_project: Path, command: str) -> None:
    """Run a printed setup step as the user would paste it (this test runs as root, and this machine has no sudo:
    Ansible's --become would ask it for root, which the test already is)."""
    command = command.replace("sudo ", "").replace(" --become", "")
    done = subprocess.run(["/bin/sh", "-c", command], cwd=door_project, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"step failed: {command}\n{done.stdout}{done.stderr}"


def open_door(door: str, rrsync: str | None = None) -> Door:
    """Run the wizard and the printed steps for one door; `rrsync`: the rrsync the wizard finds on PATH."""
    sshd = LoopbackSshd()
    try:
        sshd.start()
        door_port, controller_port = free_ports(2, taken={sshd.port})
        project = sshd.base / "proj"
        project.mkdir()
        (project / "fdl.yml").write_text("commands:\n  test:\n    run: 'true'\n")
        home = sshd.base / "home"
        home.mkdir()
        served = None
        extra: list[str] = []
        if door in ("a", "b"):
            served = sshd.base / ("data" if door == "a" else "run")
            (served / "tree").mkdir(parents=True)
            (served / "tree" / "train.rs").write_text("fn main() {}\n")
            (served / ".fdl-run.yml").write_text("bin: target/release/train\n")
            extra = ["--served", str(served)]
        user = sshd.user
        if door == "a":
            # the chroot's chain must be root-owned and not writable by others, and the jailed account must
            # reach its key file: not below the 0700 home this sshd lives in, nor below /tmp (1777)
            base = Path(tempfile.mkdtemp(prefix="fdl-doors-test-", dir="/var/lib"))
            os.chmod(base, 0o755)
            _JAIL_BASES[sshd.base] = base
            extra += ["--jail-dir", str(base)]
            user = JAILED
            _drop_account(JAILED)
        sshd.authorized_keys.write_text("# the operator's own file\n")
        os.chmod(sshd.authorized_keys, 0o600)
        env = {"HOME": str(home)}
        if rrsync is not None:
            env["PATH"] = os.pathsep.join([os.path.dirname(rrsync), os.environ["PATH"]])
        done = run_fdl("join-config", "lab", "--door", door, "--controller", f"{user}@127.0.0.1:{door_port}",
                       "--port", str(controller_port), *extra, "--install-key", "--authorized-keys",
                       str(sshd.authorized_keys), "--sshd-config", str(sshd.config), "--json",
                       cwd=project, env=env)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        (privileged,) = [s for s in report["steps"] if s["command"] and "ansible-playbook" in s["command"]]
        command = privileged["command"]
        assert command.endswith(" -i localhost, -c local flodl.fdl.join_door -e @.fdl/lab/join-door.yml --become")
        assert not (sshd.dropins / "01-fdl-lab.conf").exists()  # nothing under sshd's directory before it runs
        if door == "a":  # the /etc/fstab line goes to a file of the test's (this machine's boot is not the test's)
            assert "(and in /etc/fstab)" in privileged["title"]
            command += f" -e fdl_join_door_fstab={sshd.base / 'fstab'}"
        _run_step(project, command)
        sshd.wait_listening([sshd.port, door_port])
        listener = Listener(controller_port)
        return Door(door, sshd, project, home, project / ".fdl" / "lab", door_port, controller_port, served,
                    report, listener)
    except BaseException:
        _close(door, sshd)
        raise


JAILED = "fdl-lab"
_JAIL_BASES: dict[Path, Path] = {}


def _jail_base(sshd: LoopbackSshd) -> Path:
    return _JAIL_BASES[sshd.base]


def _drop_account(name: str) -> None:
    subprocess.run(["userdel", name], capture_output=True, timeout=30)
    subprocess.run(["groupdel", name], capture_output=True, timeout=30)


def _close(door: str, sshd: LoopbackSshd) -> None:
    base = _JAIL_BASES.pop(sshd.base, None)
    if base is not None:
        data = base / "lab" / "jail" / "data"
        subprocess.run(["umount", str(data)], capture_output=True, timeout=30)
        if not os.path.ismount(data):
            shutil.rmtree(base, ignore_errors=True)
        _drop_account(JAILED)
    sshd.stop()


@pytest.fixture(scope="module", params=["a", "b", "tunnel-only"])
def door(request):
    need_root_or_skip("runs its own sshd on loopback and logs in as the test's own account")
    if shutil.which("sshd") is None and not os.path.exists("/usr/sbin/sshd"):
        pytest.fail("openssh-server is required (scripts/apt-test.txt)")
    opened = open_door(request.param)
    yield opened
    opened.listener.close()
    _close(opened.door, opened.sshd)


# --------------------------------------------------------------------------- every door


def test_the_installed_dropin_passes_sshd_t(door):
    assert (door.sshd.dropins / "01-fdl-lab.conf").read_bytes() == (door.farm / "sshd-door.conf").read_bytes()
    checked = door.sshd.check()
    assert checked.returncode == 0, checked.stderr
    assert door.report["authorized_keys"]["action"] == ("jailed" if door.door == "a" else "added")
    assert door.sshd.authorized_keys.read_text().startswith("# the operator's own file\n")
    if door.door == "a":  # the farm key never lets anyone in as the operator
        assert "fdl-farm-lab" not in door.sshd.authorized_keys.read_text()


def test_a_command_and_a_shell_are_refused(door):
    command = door.ssh("127.0.0.1", f"echo {MARKER}")
    assert MARKER not in command.stdout + command.stderr
    assert command.returncode not in (0, 255), command.stderr  # logged in, then refused
    shell = door.ssh("-T", "127.0.0.1", input=f"echo {MARKER}\n")
    assert MARKER not in shell.stdout and shell.returncode not in (0, 255)
    tty = door.ssh("-tt", "127.0.0.1", input=f"echo {MARKER}\nexit\n")
    assert MARKER not in tty.stdout.replace(f"echo {MARKER}", "")


def test_the_forward_to_the_controller_port_goes_through(door):
    done = door.ssh("-W", f"127.0.0.1:{door.controller_port}", "127.0.0.1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "fdl-controller-hello\n"


def test_a_worker_checks_the_door_against_the_pinned_host_key_and_trusts_nothing_on_first_use(door, tmp_path):
    """regression (issue 36, finding 2): the user-data pinned no door host key, so a booted worker had no
    known_hosts entry for its door and exited 2. The farm's known_hosts (read from this sshd's HostKey) lets
    fdl's own tunnel through with StrictHostKeyChecking=yes; an empty one holds no key for the door (which the
    permanent check before the first dial turns into exit 2); another key is transient."""
    import yaml

    from fdl.agent.options import parse_ssh_hop
    from fdl.agent.tunnel import Tunnel, TunnelError, pinned_environ

    join = yaml.safe_load((door.farm / "worker.yml").read_text())["join"]
    assert join["known_hosts"] == "/etc/fdl/lab/known_hosts" and join["identity"] == "/etc/fdl/lab/key"
    pin = (door.farm / "known_hosts").read_text()
    public = door.sshd.host_key.with_name(door.sshd.host_key.name + ".pub").read_text().split()
    assert pin == f"[127.0.0.1]:{door.door_port} {public[0]} {public[1]}\n"

    def tunnel(known_hosts: Path) -> str:
        environ = pinned_environ({**os.environ, "HOME": str(tmp_path)}, str(known_hosts))
        with Tunnel(parse_ssh_hop(join["ssh"]), ("127.0.0.1", door.controller_port), identity=str(door.key),
                    environ=environ, known_hosts=str(known_hosts)) as opened:
            import socket

            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(10)
                sock.connect(opened.socket_path)
                return sock.recv(64).decode()

    assert tunnel(door.farm / "known_hosts") == "fdl-controller-hello\n"
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    # an empty pin is the box's own configuration: fdl/agent/permanent.py decides it before the first dial from
    # what the files hold (exit 2 there); the dial itself, like everything after that check, is transient
    environ = pinned_environ({**os.environ, "HOME": str(tmp_path)}, str(empty))
    keys = Tunnel(parse_ssh_hop(join["ssh"]), ("127.0.0.1", door.controller_port), identity=str(door.key),
                  environ=environ, known_hosts=str(empty)).door_keys()
    assert keys is not None and not keys.keys  # what the permanent check reads (tests/unit/agent/test_permanent.py)
    with pytest.raises(TunnelError) as none:
        tunnel(empty)
    assert none.value.exit_code == 1
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{door.door_port} " + " ".join(other.with_suffix(".pub").read_text().split()[:2])
                     + "\n")
    with pytest.raises(TunnelError) as impostor:
        tunnel(wrong)
    assert impostor.value.exit_code == 1  # what the network presents never stops a worker for good


@pytest.mark.parametrize("target", ["base-port", "localhost-name", "controller-on-other-address"])
def test_any_other_forward_is_refused(door, target):
    dest = {"base-port": f"127.0.0.1:{door.sshd.port}", "localhost-name": f"localhost:{door.controller_port}",
            "controller-on-other-address": f"127.0.0.2:{door.controller_port}"}[target]
    done = door.ssh("-W", dest, "127.0.0.1")
    assert done.returncode != 0 and "administratively prohibited" in done.stderr
    assert "fdl-controller-hello" not in done.stdout


def test_a_remote_forward_is_refused(door):
    back = free_ports(1, taken={door.sshd.port, door.door_port, door.controller_port})[0]
    done = door.ssh("-N", "-o", "ExitOnForwardFailure=yes", "-R", f"{back}:127.0.0.1:{door.sshd.port}", "127.0.0.1")
    assert done.returncode == 255 and "remote port forwarding failed" in done.stderr


def test_the_wizards_own_self_test_passes(door):
    done = subprocess.run(["sh", str(door.farm / "door-selftest.sh"), "127.0.0.1"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"door self-test passed: farm lab, door {door.door}" in done.stdout
    assert "FAIL" not in done.stdout


def _sftp(door: Door, script: str, port: int | None = None):
    return subprocess.run(["sftp", "-b", "-", *door.sshd.ssh_opts(door.key, door.door_port)[:-2], "-o",
                           f"User={door.user}", "-P", str(port or door.door_port), "127.0.0.1"], input=script,
                          capture_output=True, text=True, timeout=30)


def _rsync(door: Door, *args: str):
    opts = " ".join(door.sshd.ssh_opts(door.key, door.door_port) + ["-l", door.user])
    return subprocess.run(["rsync", "-e", f"ssh {opts}", *args], capture_output=True, text=True, timeout=30)


def test_only_door_a_opens_sftp_and_it_cannot_write(door, tmp_path):
    got = tmp_path / "got.rs"
    done = _sftp(door, f"ls tree\nget tree/train.rs {got}\n")
    if door.door != "a":
        assert done.returncode != 0 and not got.exists()
        return
    assert done.returncode == 0, done.stderr
    assert got.read_text() == "fn main() {}\n"
    (tmp_path / "up").write_text("x")
    write = _sftp(door, f"put {tmp_path / 'up'} tree/up\n")
    assert write.returncode != 0 and not (door.served / "tree" / "up").exists()
    mkdir = _sftp(door, "mkdir tree/new\n")
    assert mkdir.returncode != 0 and not (door.served / "tree" / "new").exists()


def test_only_door_b_lists_the_served_tree_through_rrsync(door, tmp_path):
    listing = _rsync(door, "--list-only", "-r", "127.0.0.1:/")
    if door.door != "b":
        assert listing.returncode != 0 and "train.rs" not in listing.stdout
        return
    assert listing.returncode == 0, listing.stderr
    assert "tree/train.rs" in listing.stdout and ".fdl-run.yml" in listing.stdout
    pulled = _rsync(door, "-a", "127.0.0.1:/tree/", f"{tmp_path}/pulled/")
    assert pulled.returncode == 0 and (tmp_path / "pulled" / "train.rs").read_text() == "fn main() {}\n"


def test_no_door_takes_an_rsync_write_and_door_b_stays_inside_the_served_directory(door, tmp_path):
    (tmp_path / "x").write_text("x")
    write = _rsync(door, str(tmp_path / "x"), "127.0.0.1:/tree/x")
    assert write.returncode != 0
    if door.served is not None:
        assert not (door.served / "tree" / "x").exists()
    if door.door != "b":
        return
    assert "read-only" in write.stderr
    up = _rsync(door, "--list-only", "127.0.0.1:../")
    assert up.returncode != 0 and "do not use .." in up.stderr
    absolute = _rsync(door, "--list-only", "127.0.0.1:/etc/passwd")
    assert absolute.returncode != 0 and "root:" not in absolute.stdout
    (door.served / "escape").symlink_to("/etc")
    try:
        link = _rsync(door, "--list-only", "127.0.0.1:/escape/passwd")
        assert link.returncode != 0 and "passwd" not in link.stdout
    finally:
        (door.served / "escape").unlink()


def _plant_links(door: Door) -> Path:
    """Links in the served tree that point out of it (a tree published before links were refused)."""
    secret = door.sshd.base / "secret"
    secret.mkdir(exist_ok=True)
    (secret / "id").write_text("PRIVATE-KEY-MATERIAL\n")
    tree = door.served / "tree"
    (tree / "keys").symlink_to(secret)
    (tree / "up").symlink_to("../../secret/id")
    return secret


def _unplant(door: Door) -> None:
    for name in ("keys", "up"):
        (door.served / "tree" / name).unlink()
    shutil.rmtree(door.sshd.base / "secret")


def _holding_the_secret(dest: Path) -> list[str]:
    return [str(p) for p in dest.rglob("*") if p.is_file() and not p.is_symlink()
            and "PRIVATE-KEY-MATERIAL" in p.read_text(errors="replace")]


@pytest.mark.parametrize("client", [["-a"], ["-a", "--copy-unsafe-links"], ["-aL"], ["-a", "--copy-dirlinks"],
                                    ["-a", "--copy-unsafe-links", "--munge-links"]])
def test_no_door_gives_what_a_link_out_of_the_tree_points_at(door, tmp_path, client):
    """A door-b key holder asking rrsync to follow links gets nothing from outside the served tree."""
    dest = tmp_path / "pulled"
    if door.door == "tunnel-only":
        done = _rsync(door, *client, "127.0.0.1:/tree/", f"{dest}/")
        assert done.returncode != 0 and not dest.exists()
        return
    if door.door == "a":
        return  # sftp: the next test
    _plant_links(door)
    try:
        done = _rsync(door, *client, "127.0.0.1:/tree/", f"{dest}/")
        assert (dest / "train.rs").exists() or done.returncode != 0, done.stderr
        assert not dest.exists() or _holding_the_secret(dest) == []
        direct = _rsync(door, *client, "127.0.0.1:/tree/keys/", f"{tmp_path}/direct/")
        assert direct.returncode != 0 and not (tmp_path / "direct" / "id").exists()
    finally:
        _unplant(door)


def _operator_secret(door: Door) -> Path:
    """A private file of the operator's account, in a 0700 directory beside the served tree."""
    return door.sshd.base / "secret" / "id"


@pytest.mark.parametrize("path", ["/etc/hostname", "../secret/id", "../../secret/id", "ABS-SECRET", "ABS-KEYS",
                                  "ABS-HOME-SSH", "tree/keys/id", "tree/up", "tree/abs"])
def test_door_a_reads_nothing_outside_the_served_tree(door, tmp_path, path):
    """regression: door a's key ran `internal-sftp -R -d <served>` as the operator's account, and -d only picks
    the starting directory, so any farm key holder could `get` every file that account can read."""
    if door.door != "a":
        return
    _plant_links(door)
    (door.served / "tree" / "abs").symlink_to(_operator_secret(door))
    wanted = {"ABS-SECRET": str(_operator_secret(door)), "ABS-KEYS": str(door.sshd.authorized_keys),
              "ABS-HOME-SSH": str(Path.home() / ".ssh")}.get(path, path)
    got = tmp_path / "got"
    try:
        done = _sftp(door, f"get -r {wanted} {got}\n")
        assert done.returncode != 0, done.stdout
        assert not got.exists() or _holding_the_secret(got if got.is_dir() else tmp_path) == []
        inside = _sftp(door, f"get tree/train.rs {tmp_path / 'ok.rs'}\n")  # the served tree itself still reads
        assert inside.returncode == 0 and (tmp_path / "ok.rs").read_text() == "fn main() {}\n", inside.stderr
    finally:
        (door.served / "tree" / "abs").unlink()
        _unplant(door)


def test_door_a_sees_only_the_served_tree_at_its_root(door):
    if door.door != "a":
        return
    done = _sftp(door, "pwd\nls -1a /\nls -1a /data\n")
    assert done.returncode == 0, done.stderr
    assert "Remote working directory: /data" in done.stdout
    listed = [ln.strip() for ln in done.stdout.splitlines() if ln.startswith("/")]
    assert sorted(e for e in listed if e.count("/") == 1) == ["/.", "/..", "/data"]  # nothing but the mount
    assert "/data/tree" in listed


def test_the_door_a_key_is_jailed_on_the_base_port_too(door, tmp_path):
    """A Match LocalPort block does not tie a key to a port: the jail must hold on sshd's other ports."""
    if door.door != "a":
        return
    done = _sftp(door, f"get /etc/hostname {tmp_path / 'h'}\n", port=door.sshd.port)
    assert not (tmp_path / "h").exists()
    listing = _sftp(door, "ls -1 /data/tree\n", port=door.sshd.port)
    assert listing.returncode == 0 and "train.rs" in listing.stdout, done.stderr + listing.stderr


def test_sshfs_through_door_a_mounts_the_served_tree_and_nothing_else(door, tmp_path):
    if door.door != "a":
        return
    if shutil.which("sshfs") is None:
        pytest.fail("sshfs is required (scripts/apt-test.txt)")
    _plant_links(door)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    opts = door.sshd.ssh_opts(door.key, door.door_port)
    ssh_cmd = "ssh " + " ".join(opts[:-2])
    try:
        # follow_symlinks: the server resolves every link (an attacker's choice); without it the client's own
        # kernel would resolve them against the client's files, which is no read through the door
        mounted = subprocess.run(["sshfs", "-o", f"ssh_command={ssh_cmd},port={door.door_port},ro,follow_symlinks",
                                  f"{door.user}@127.0.0.1:/data", str(mnt)], capture_output=True, text=True,
                                 timeout=60)
        assert mounted.returncode == 0, mounted.stderr
        try:
            assert (mnt / "tree" / "train.rs").read_text() == "fn main() {}\n"
            for link in ("keys/id", "up"):
                try:
                    text = (mnt / "tree" / link).read_text(errors="replace")
                except OSError:
                    continue
                assert "PRIVATE-KEY-MATERIAL" not in text, link
        finally:
            subprocess.run(["fusermount", "-u", str(mnt)], capture_output=True, timeout=30)
    finally:
        _unplant(door)


def test_door_b_key_line_runs_rrsync_behind_the_guard(door):
    """regression: door b's forced command lacked -munge, then ran rrsync with no guard against the options
    Debian 12's release rrsync lets through (--copy-unsafe-links)."""
    keys = door.jail / ".ssh" / "authorized_keys" if door.door == "a" else door.sshd.authorized_keys
    line = next(ln for ln in keys.read_text().splitlines() if "fdl-farm-lab" in ln)
    if door.door == "b":
        assert 'command="/bin/sh -c \'case $SSH_ORIGINAL_COMMAND in *--copy-unsafe-links*|' in line
        assert f" -ro -munge {door.served}'\"" in line
    else:
        assert "rrsync" not in line


def test_a_worker_pull_through_door_b_keeps_no_link_out_of_its_tree(door, tmp_path):
    """regression: pulls copied links as they were; with --safe-links one pointing out of the tree stays behind."""
    if door.door != "b":
        return
    from fdl.publish.fetch import pull_run
    from fdl.publish.manifest import MANIFEST_NAME, Manifest, write_manifest
    from fdl.publish.spec import parse_source_spec

    _plant_links(door)
    (door.served / "tree" / "inside").symlink_to("train.rs")
    write_manifest(door.served / "tree", Manifest(bin="x", run="cd" * 16, published_epoch=1, built=True))
    try:
        spec = parse_source_spec(f"rsync://{door.sshd.user}@127.0.0.1:{door.door_port}:/tree")
        env = {**os.environ, "RSYNC_RSH": "ssh " + " ".join(door.sshd.ssh_opts(door.key, door.door_port)[:-2])}
        manifest = pull_run(spec, tmp_path / "worker", identity=str(door.key), env=env)
        assert manifest.run == "cd" * 16
        worker = tmp_path / "worker"
        assert (worker / "train.rs").exists() and os.readlink(worker / "inside") == "train.rs"
        assert not (worker / "keys").is_symlink() and not (worker / "up").is_symlink()
        assert _holding_the_secret(worker) == []
    finally:
        (door.served / "tree" / "inside").unlink()
        (door.served / "tree" / MANIFEST_NAME).unlink()
        _unplant(door)


def test_the_door_confines_any_key_that_arrives_on_its_port(door, tmp_path):
    """The operator's own, unrestricted key: a shell on the base port, the door's limits on the door port."""
    own = tmp_path / "own"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(own)], check=True)
    keys = door.sshd.authorized_keys
    before = keys.read_bytes()
    keys.write_bytes(before + (tmp_path / "own.pub").read_bytes())
    try:
        me = door.sshd.user
        base = door.ssh("127.0.0.1", f"echo {MARKER}", key=own, port=door.sshd.port, user=me)
        assert base.stdout.strip() == MARKER
        other = door.ssh("-W", f"127.0.0.1:{door.sshd.port}", "127.0.0.1", key=own, user=me)
        assert "administratively prohibited" in other.stderr
        tty = door.ssh("-tt", "127.0.0.1", "true", key=own, user=me)
        assert "PTY allocation request failed" in tty.stderr
        if door.door == "tunnel-only":
            forced = door.ssh("127.0.0.1", f"echo {MARKER}", key=own, user=me)
            assert MARKER not in forced.stdout and "this door only forwards" in forced.stderr
    finally:
        keys.write_bytes(before)


# --------------------------------------------------------------------------- door b on each Debian 12 rsync


@pytest.fixture(scope="module")
def unpacked_rrsync(tmp_path_factory):
    """Each of Debian 12's rsync releases, unpacked once: version -> its rrsync."""
    cache: dict[str, str] = {}

    def get(version: str) -> str:
        if version not in cache:
            cache[version] = unpack_rrsync(version, tmp_path_factory.mktemp(f"rsync-{version}"))
        return cache[version]

    return get


@pytest.fixture(scope="module", params=RELEASES)
def door_b(request, unpacked_rrsync):
    """Door b as the wizard installs it when the rrsync on PATH is Debian 12's rsync of one release."""
    need_root_or_skip("runs its own sshd on loopback and logs in as the test's own account")
    rrsync = unpacked_rrsync(request.param)
    opened = open_door("b", rrsync=rrsync)
    try:
        line = next(ln for ln in opened.sshd.authorized_keys.read_text().splitlines() if "fdl-farm-lab" in ln)
        assert f"{rrsync} -ro -munge {opened.served}" in line  # the key runs this release's rrsync
        yield opened
    finally:
        opened.listener.close()
        _close(opened.door, opened.sshd)


FOLLOWING = {  # what a client can ask of the sending side to get what a link points at
    "copy-unsafe-links": ["-a", "--copy-unsafe-links"],
    "copy-unsafe-links-munged": ["-a", "--copy-unsafe-links", "--munge-links"],
    "L": ["-aL"],
    "copy-links": ["-a", "--copy-links"],
    "k": ["-ak"],
    "copy-dirlinks": ["-a", "--copy-dirlinks"],
    "plain": ["-a"],
}


@pytest.mark.parametrize("client", sorted(FOLLOWING))
def test_door_b_gives_nothing_a_link_out_of_the_tree_points_at(door_b, tmp_path, client):
    """regression: on rsync 3.2.7, `rrsync -ro -munge` let --copy-unsafe-links through, and the server sent
    the files that links out of the served tree point at (a key file, the operator's home)."""
    _plant_links(door_b)
    (door_b.served / "tree" / "home").symlink_to(door_b.sshd.base)  # the account's own files, absolute
    try:
        dest = tmp_path / "pulled"
        done = _rsync(door_b, *FOLLOWING[client], "127.0.0.1:/tree/", f"{dest}/")
        assert not dest.exists() or _holding_the_secret(dest) == [], done.stderr
        if client == "plain":  # the door still serves the tree; links stay links, never their targets
            assert done.returncode == 0, done.stderr
            assert (dest / "train.rs").read_text() == "fn main() {}\n" and (dest / "keys").is_symlink()
        else:
            assert done.returncode != 0, f"{FOLLOWING[client]} was not refused:\n{done.stdout}"
        for through in ("/tree/keys/", "/tree/keys/id", "/tree/up", "/tree/home/secret/id"):
            direct = _rsync(door_b, *FOLLOWING[client], f"127.0.0.1:{through}", f"{tmp_path}/direct/")
            assert direct.returncode != 0 and _holding_the_secret(tmp_path / "direct") == [], through
    finally:
        (door_b.served / "tree" / "home").unlink()
        _unplant(door_b)


def test_door_b_refuses_a_file_list_that_walks_through_a_link(door_b, tmp_path):
    """regression: rsync 3.2.7 behind rrsync resolved --files-from entries through a directory link out of the
    tree (`keys/id` with keys -> a directory outside) and sent the file."""
    _plant_links(door_b)
    listing = tmp_path / "list"
    listing.write_text("keys/id\nup\ntrain.rs\n")
    try:
        for extra in ([], ["-r"], ["--copy-unsafe-links"]):
            done = _rsync(door_b, "-a", *extra, f"--files-from={listing}", "127.0.0.1:/tree/", f"{tmp_path}/got/")
            assert done.returncode != 0 and _holding_the_secret(tmp_path / "got") == [], done.stderr
    finally:
        _unplant(door_b)


def test_door_b_still_serves_a_worker_and_the_self_test_tries_a_planted_link(door_b, tmp_path):
    from fdl.publish.fetch import pull_run
    from fdl.publish.manifest import MANIFEST_NAME, Manifest, write_manifest
    from fdl.publish.spec import parse_source_spec

    write_manifest(door_b.served / "tree", Manifest(bin="x", run="ab" * 16, published_epoch=1, built=True))
    try:
        spec = parse_source_spec(f"rsync://{door_b.sshd.user}@127.0.0.1:{door_b.door_port}:/tree")
        env = {**os.environ, "RSYNC_RSH": "ssh " + " ".join(door_b.sshd.ssh_opts(door_b.key, door_b.door_port)[:-2])}
        assert pull_run(spec, tmp_path / "worker", identity=str(door_b.key), env=env).run == "ab" * 16
        assert (tmp_path / "worker" / "train.rs").read_text() == "fn main() {}\n"
    finally:
        (door_b.served / "tree" / MANIFEST_NAME).unlink()
    done = subprocess.run(["sh", str(door_b.farm / "door-selftest.sh"), "127.0.0.1"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "FAIL" not in done.stdout, done.stdout + done.stderr
    for follow in ("--copy-unsafe-links", "--copy-links"):
        assert f"ok    rsync {follow} gets nothing a link out of the served directory points at" in done.stdout
    assert "skip" not in done.stdout
    assert sorted(p.name for p in door_b.served.iterdir()) == [".fdl-run.yml", "tree"]  # the planted link is gone


# --------------------------------------------------------------------------- rotation


def test_regen_makes_the_old_key_fail_against_the_live_sshd(tmp_path):
    need_root_or_skip("runs its own sshd on loopback")
    opened = open_door("tunnel-only")
    try:
        old_key = tmp_path / "old_key"
        shutil.copy(opened.key, old_key)
        os.chmod(old_key, 0o600)
        assert opened.ssh("-W", f"127.0.0.1:{opened.controller_port}", "127.0.0.1", key=old_key).returncode == 0
        foreign = b"# kept\r\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIForeignForeignForeignForeignForeignForeig01 x\r\n"
        keys = opened.sshd.authorized_keys
        keys.write_bytes(foreign + keys.read_bytes())
        old_token = (opened.farm / "token").read_text()
        done = opened.wizard("--regen", "--install-key")
        assert done.returncode == 0, done.stderr
        assert (opened.farm / "token").read_text() != old_token
        refused = opened.ssh("-W", f"127.0.0.1:{opened.controller_port}", "127.0.0.1", key=old_key)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr
        fresh = opened.ssh("-W", f"127.0.0.1:{opened.controller_port}", "127.0.0.1")
        assert fresh.returncode == 0 and fresh.stdout == "fdl-controller-hello\n"
        assert keys.read_bytes() == foreign + b"# the operator's own file\n" + \
            (opened.farm / "authorized_keys.line").read_bytes()
    finally:
        opened.listener.close()
        opened.sshd.stop()
