"""`fdl libtorch`: list, download (from real HTTP(S) servers on loopback: PyTorch's own location over TLS,
mirrors in either naming), activate, info; the probe finding what was activated; what a failed download
leaves (nothing) and what still works after it. Also: every `fdl ...` command a hint names exists."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, fdl_env, need_root_or_skip, run_fdl
from tests.fakes import make_libtorch
from tests.fakes.libtorch_server import (
    LibtorchServer,
    PyTorchOverTls,
    corrupt_crc,
    fake_archive,
    fdl_path,
    official_path,
)
from tests.integration.launch.helpers import free_port
from tests.integration.publish_support import publish_env


@pytest.fixture
def mirror():
    """A real HTTP server on 127.0.0.1 serving a fake cpu libtorch in fdl's naming, with its .sha256."""
    with LibtorchServer() as server:
        archive = fake_archive("cpu")
        server.put(fdl_path("cpu"), archive)
        server.put(fdl_path("cpu") + ".sha256",
                   f"{hashlib.sha256(archive).hexdigest()}  libtorch-cpu.zip\n".encode())
        yield server


def env_for(home: Path, **extra: str) -> dict:
    # FDL_LIBTORCH_FROM_PYTORCH=0: the test venv's own PyTorch would otherwise be found last.
    return {"HOME": str(home), "FDL_LIBTORCH_FROM_PYTORCH": "0", "LIBTORCH": "", "LIBTORCH_PATH": "",
            "FDL_LIBTORCH_MIRROR": "", **extra}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_list_download_activate_then_probe_finds_it(tmp_path: Path, mirror) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = env_for(home, FDL_LIBTORCH_MIRROR=mirror.url)

    empty = run_fdl("libtorch", "list", cwd=project, env=env)
    assert empty.returncode == 0 and "No libtorch variant is installed" in empty.stdout
    assert "fdl libtorch download" in empty.stdout

    got = run_fdl("libtorch", "download", "--cpu", cwd=project, env=env)
    assert got.returncode == 0, got.stderr
    variant = home / ".flodl" / "libtorch" / "precompiled" / "cpu"
    assert (variant / "lib" / "libtorch.so").is_file()
    assert "sha256 verified against the mirror's .sha256" in got.stderr and "now the active variant" in got.stdout
    assert (home / ".flodl" / "libtorch" / ".active").read_text().strip() == "precompiled/cpu"

    listed = json.loads(run_fdl("libtorch", "list", "--json", cwd=project, env=env).stdout)
    [row] = listed["variants"]
    assert (row["label"], row["scope"], row["version"], row["variant"], row["active_in_root"], row["in_use"]) == \
        ("precompiled/cpu", "home", "2.13.0", "cpu", True, True)
    assert row["sha256"] == sha(mirror.files["/libtorch-cpu.zip"])

    activated = run_fdl("libtorch", "activate", "cpu", cwd=project, env=env)
    assert activated.returncode == 0 and "precompiled/cpu" in activated.stdout

    probe = json.loads(run_fdl("probe", "--json", "--skip-mount", cwd=project, env=env).stdout)
    check = next(c for c in probe["checks"] if c["name"] == "libtorch")
    assert check["data"]["path"] == str(variant) and check["data"]["active"] == "precompiled/cpu"
    assert check["data"]["version"] == "2.13.0" and check["data"]["source"] == "home"

    info = run_fdl("libtorch", "info", cwd=project, env=env)
    assert info.returncode == 0 and f"Resolved: {variant} (from home)" in info.stdout

    # A second download of an installed variant fetches nothing and leaves .active alone.
    again = run_fdl("libtorch", "download", "cpu", "--json", cwd=project, env=env)
    assert json.loads(again.stdout) == {"variant": "cpu", "label": "precompiled/cpu", "path": str(variant),
                                        "downloaded": False, "activated": False, "active": True,
                                        "sha256": row["sha256"], "source": mirror.url}


def test_with_no_configuration_the_download_comes_from_pytorch_over_https(tmp_path: Path) -> None:
    """download.pytorch.org as a real TLS server behind a CONNECT proxy (HTTPS_PROXY, REQUESTS_CA_BUNDLE):
    nothing configured, the pinned release in PyTorch's naming, verified and recorded."""
    home = tmp_path / "home"
    home.mkdir()
    archive = fake_archive("cpu")
    with PyTorchOverTls(tmp_path / "tls") as pytorch:
        pytorch.server.put("/libtorch" + official_path("cpu"), archive)
        got = run_fdl("libtorch", "download", "cpu", "--json", cwd=tmp_path, env=env_for(home, **pytorch.env))
    assert got.returncode == 0, got.stderr
    assert pytorch.proxy.connects == ["download.pytorch.org:443"]
    assert json.loads(got.stdout)["source"] == "https://download.pytorch.org/libtorch"
    assert json.loads(got.stdout)["sha256"] == sha(archive)
    assert "downloading https://download.pytorch.org/libtorch/cpu/libtorch-shared-with-deps-2.13.0%2Bcpu.zip" \
        in got.stderr and "no pin to check against" in got.stderr


# --------------------------------------------------------------------------- a failed download leaves nothing

def project_for_afterwards(root: Path, port: int) -> Path:
    """A project whose build links no libtorch: `fdl publish` and `fdl @cluster train` (a single-host cluster
    run with a build recipe, so its libtorch is resolved) must work whatever a failed download did."""
    root.mkdir(parents=True)
    (root / "a.txt").write_text("one\n")
    rank = (f"{sys.executable} -c 'import os; print(\"RANK\", os.environ[\"RANK\"], "
            f"os.environ.get(\"LIBTORCH_PATH\") or \"none\")'")
    (root / "fdl.yml").write_text(yaml.safe_dump({"commands": {"train": {
        "cluster": True, "build": "mkdir -p out && cat a.txt > out/app", "run": rank, "local_devices": "cpu:2"}}}))
    (root / "fdl.cluster.yml").write_text(yaml.safe_dump({"cluster": {"controller": {"port": port}}}))
    return root


def still_works(project: Path, home: Path) -> None:
    env = publish_env(home, FDL_LIBTORCH_FROM_PYTORCH="0", LIBTORCH="")
    published = run_fdl("publish", f"file://{project}", "--bin", "out/app", "--build", "mkdir -p out && cat a.txt "
                        "> out/app", "--to", str(project.parent / "served"), cwd=project, env=env)
    assert published.returncode == 0, published.stderr
    assert "no libtorch found" in published.stderr
    trained = run_fdl("@cluster", "train", cwd=project, env=env, timeout=180)
    assert trained.returncode == 0, trained.stderr + trained.stdout
    assert sorted(re.findall(r"RANK (\d) none", trained.stdout)) == ["0", "1"], trained.stdout + trained.stderr


def test_a_failed_download_leaves_nothing_and_other_commands_still_work(tmp_path: Path) -> None:
    """The official layout on a mirror: a corrupted zip, a wrong pin, a dropped connection each fail cleanly
    (exit 1, nothing under ~/.flodl); then the good archive installs and verifies, and `fdl libtorch info`
    shows its recorded SHA-256."""
    home = tmp_path / "home"
    home.mkdir()
    project = project_for_afterwards(tmp_path / "project", free_port())
    good = fake_archive("cpu")
    path = "/libtorch" + official_path("cpu")
    with LibtorchServer() as server:
        url = server.url + "/libtorch"
        env = env_for(home)

        server.put(path, corrupt_crc(good))
        corrupt = run_fdl("libtorch", "download", "cpu", "--mirror", url, cwd=project, env=env)
        assert corrupt.returncode == 1 and "fails its CRC check" in corrupt.stderr, corrupt.stderr
        assert "Traceback" not in corrupt.stderr and list(home.iterdir()) == []

        server.put(path, good)
        pinned = dict(yaml.safe_load((project / "fdl.yml").read_text()), libtorch={"sha256": {"cpu": "e" * 64}})
        (project / "fdl.yml").write_text(yaml.safe_dump(pinned))
        wrong = run_fdl("libtorch", "download", "cpu", "--mirror", url, cwd=project, env=env)
        assert wrong.returncode == 1 and f"libtorch.sha256 says {'e' * 64}" in wrong.stderr, wrong.stderr
        assert list(home.iterdir()) == []
        pinned["libtorch"] = {"sha256": {"cpu": sha(good)}}
        (project / "fdl.yml").write_text(yaml.safe_dump(pinned))

        server.drop.add(path.replace("%2B", "+"))
        dropped = run_fdl("libtorch", "download", "cpu", "--mirror", url, cwd=project, env=env)
        assert dropped.returncode == 1 and "broke off" in dropped.stderr, dropped.stderr
        assert list(home.iterdir()) == []

        still_works(project, home)

        server.drop.clear()
        got = run_fdl("libtorch", "download", "cpu", "--mirror", url, cwd=project, env=env)
    assert got.returncode == 0, got.stderr
    assert "sha256 verified against libtorch.sha256" in got.stderr and f"Archive sha256: {sha(good)}" in got.stdout
    info = run_fdl("libtorch", "info", cwd=project, env=env)
    assert info.returncode == 0 and f"archive sha256 {sha(good)}" in info.stdout
    assert json.loads(run_fdl("libtorch", "info", "--json", cwd=project, env=env).stdout)["libtorch"]["sha256"] \
        == sha(good)


def test_what_an_older_failed_download_left_breaks_nothing(tmp_path: Path) -> None:
    """Regression: an empty ~/.flodl/libtorch/precompiled/ and a .lock (an older fdl's failed download) made
    `fdl publish` and `fdl @cluster train` exit 1 with 'holds no libtorch variant'."""
    home = tmp_path / "home"
    (home / ".flodl" / "libtorch" / "precompiled").mkdir(parents=True)
    (home / ".flodl" / "libtorch" / ".lock").write_text("")
    project = project_for_afterwards(tmp_path / "project", free_port())
    still_works(project, home)
    probe = json.loads(run_fdl("probe", "--json", "--skip-mount", cwd=project, env=env_for(home)).stdout)
    check = next(c for c in probe["checks"] if c["name"] == "libtorch")
    assert "nothing is installed at" in check["message"] and "fdl libtorch download" in check["hint"]


# --------------------------------------------------------------------------- sources, names and configuration

def test_the_mirror_comes_from_the_flag_the_environment_or_either_block(tmp_path: Path, mirror) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for block in ({"libtorch": {"mirror": mirror.url}}, {"join": {"libtorch_mirror": mirror.url}}):
        (tmp_path / "fdl.yml").write_text(yaml.safe_dump(block))
        got = run_fdl("libtorch", "download", "cpu", "--json", cwd=tmp_path, env=env_for(home))
        assert got.returncode == 0 and json.loads(got.stdout)["source"] == mirror.url, got.stderr
    (tmp_path / "fdl.yml").write_text(yaml.safe_dump({"libtorch": {"mirror": "http://127.0.0.1:9/nowhere"}}))
    flag = run_fdl("libtorch", "download", "cpu", "--json", "--mirror", mirror.url, cwd=tmp_path, env=env_for(home))
    assert json.loads(flag.stdout)["source"] == mirror.url


def test_bad_names_sources_and_pins_are_refused_with_the_documented_codes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bad = run_fdl("libtorch", "download", "cu999", cwd=tmp_path, env=env_for(home))
    assert bad.returncode == 2 and "'cu999' is not one of them" in bad.stderr
    unpublished = run_fdl("libtorch", "download", "cu128", cwd=tmp_path, env=env_for(home))
    assert unpublished.returncode == 2 and "PyTorch 2.13.0 publishes no cu128 libtorch" in unpublished.stderr
    assert "--mirror" in unpublished.stderr
    flag = run_fdl("libtorch", "download", "cpu", "--mirror", "ftp://x/y", cwd=tmp_path, env=env_for(home))
    assert flag.returncode == 2 and "from --mirror: 'ftp://x/y' is not an http:// or https://" in flag.stderr
    variable = run_fdl("libtorch", "download", "cpu", cwd=tmp_path, env=env_for(home, FDL_LIBTORCH_MIRROR="x y"))
    assert variable.returncode == 1 and "from FDL_LIBTORCH_MIRROR" in variable.stderr  # configuration: exit 1
    (tmp_path / "fdl.yml").write_text("libtorch:\n  sha256:\n    cpu: 1234\n")
    pin = run_fdl("libtorch", "download", "cpu", cwd=tmp_path, env=env_for(home))
    assert pin.returncode == 1 and "fdl.yml:3: libtorch.sha256.cpu: expected a SHA-256 in hex" in pin.stderr
    (tmp_path / "fdl.yml").write_text("libtorch:\n  sha265: {}\n")
    typo = run_fdl("libtorch", "list", cwd=tmp_path, env=env_for(home))
    assert typo.returncode == 0 and "unknown key 'libtorch.sha265' (did you mean 'sha256'?)" in typo.stderr
    (tmp_path / "fdl.yml").write_text("libtorch:\n  mirror: not-a-url\n")
    url = run_fdl("libtorch", "download", "cpu", cwd=tmp_path, env=env_for(home))
    assert url.returncode == 1 and "fdl.yml:2: libtorch.mirror: expected an http:// or https:// base URL" in url.stderr
    assert list(home.iterdir()) == []
    (tmp_path / "fdl.yml").unlink()
    missing = run_fdl("libtorch", "activate", "cu130", cwd=tmp_path, env=env_for(home))
    assert missing.returncode == 1 and "precompiled/cu130 is not installed" in missing.stderr
    assert "fdl libtorch download cu130" in missing.stderr
    nosuch = run_fdl("libtorch", "activate", "nosuch", cwd=tmp_path, env=env_for(home))
    assert nosuch.returncode == 1 and "fdl libtorch download" in nosuch.stderr


def test_an_unreachable_mirror_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        home = tmp_path / "home"
        home.mkdir()
        result = run_fdl("libtorch", "download", "cpu", "--mirror", url, cwd=tmp_path, env=env_for(home))
    assert result.returncode == 1
    assert f"cannot download {url}/libtorch-cpu.zip.sha256" in result.stderr and "Traceback" not in result.stderr
    assert f"the mirror {url} (from --mirror)" in result.stderr and list(home.iterdir()) == []


def test_an_offline_box_is_told_about_the_mirror_in_whole_words(tmp_path: Path) -> None:
    """Regression (issue 38 item 11): offline (a network namespace with no network: the name does not even
    resolve), `fdl libtorch download` printed urllib3's wrappers cut at 200 characters mid-word
    ("NameResolutionError("HTTPSConnection(h....") and a hint that named neither --mirror nor
    FDL_LIBTORCH_MIRROR."""
    import subprocess

    need_root_or_skip("a network namespace without a network (unshare --net) needs root")
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(["unshare", "--net", sys.executable, "-m", "fdl", "libtorch", "download", "cpu"],
                          cwd=tmp_path, env=fdl_env(env_for(home)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("fdl: error:")]
    assert error.startswith("fdl: error: cannot download https://download.pytorch.org/libtorch/cpu/")
    reason = error.split(".zip: ", 1)[1]
    assert "download.pytorch.org" in reason and reason.endswith(")."), reason  # urllib3's cause, whole
    assert "..." not in reason and "Max retries" not in reason and "Connection(" not in reason
    hint = done.stderr.split("hint: ", 1)[1]
    assert "cannot reach download.pytorch.org" in hint
    assert "--mirror URL" in hint and "FDL_LIBTORCH_MIRROR=URL" in hint and "libtorch: mirror:" in hint
    assert list(home.iterdir()) == []


# --------------------------------------------------------------------------- housekeeping (issue 38 item 12)

def test_remove_takes_a_variant_away_in_one_step_and_keeps_the_active_one_unless_told(tmp_path: Path) -> None:
    """Regression: there was no way to remove a variant but rm -rf, which left `.active` dangling and the probe
    failing. `fdl libtorch remove` refuses the active one (exit 1, nothing touched) unless --force, which takes
    `.active` with it; a variant removed leaves no trace, not even a hidden directory."""
    home = tmp_path / "home"
    root = home / ".flodl" / "libtorch"
    make_libtorch(root, "precompiled/cpu", cuda=None, archs=None, torch="2.13.0")
    make_libtorch(root, "precompiled/cu130", cuda="13.0", torch="2.13.0", activate=False)
    (root / ".active").write_text("precompiled/cpu\n")
    env = env_for(home)

    refused = run_fdl("libtorch", "remove", "cpu", cwd=tmp_path, env=env)
    assert refused.returncode == 1
    assert "precompiled/cpu is the active variant" in refused.stderr
    assert "fdl libtorch activate precompiled/cu130" in refused.stderr and "--force" in refused.stderr
    assert (root / "precompiled/cpu/lib").is_dir() and (root / ".active").read_text().strip() == "precompiled/cpu"

    other = run_fdl("libtorch", "remove", "cu130", "--json", cwd=tmp_path, env=env)
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout) == {"variant": "precompiled/cu130", "root": str(root),
                                        "path": str(root / "precompiled/cu130"), "removed": True,
                                        "active_cleared": False, "remaining": ["precompiled/cpu"]}
    assert sorted(p.name for p in (root / "precompiled").iterdir()) == ["cpu"]  # no hidden leftover

    forced = run_fdl("libtorch", "remove", "precompiled/cpu", "--force", cwd=tmp_path, env=env)
    assert forced.returncode == 0, forced.stderr
    assert f"Removed libtorch precompiled/cpu ({root}/precompiled/cpu)." in forced.stdout
    assert not (root / ".active").exists() and not (root / "precompiled").exists()
    gone = run_fdl("libtorch", "remove", "cpu", cwd=tmp_path, env=env)
    assert gone.returncode == 1 and "precompiled/cpu is not installed" in gone.stderr
    assert run_fdl("libtorch", "remove", "../etc", cwd=tmp_path, env=env).returncode == 2


def test_a_dangling_active_is_named_and_repaired(tmp_path: Path) -> None:
    """A variant deleted by hand leaves `.active` naming it: the probe fails there. `fdl libtorch list` warns,
    the probe's hint names the repair, and `fdl libtorch remove` of that variant clears the pointer."""
    home = tmp_path / "home"
    root = home / ".flodl" / "libtorch"
    make_libtorch(root, "precompiled/cpu", cuda=None, archs=None, torch="2.13.0")
    (root / ".active").write_text("precompiled/cu130\n")  # its directory was rm -rf'ed
    env = env_for(home)
    listed = run_fdl("libtorch", "list", cwd=tmp_path, env=env)
    assert f"{root}/.active names precompiled/cu130, which is not installed there" in listed.stderr
    assert "fdl libtorch remove precompiled/cu130" in listed.stderr
    assert json.loads(run_fdl("libtorch", "list", "--json", cwd=tmp_path, env=env).stdout)["dangling_active"] == [
        {"root": str(root), "variant": "precompiled/cu130"}]
    probe = json.loads(run_fdl("probe", "--json", "--skip-mount", "--cpu", cwd=tmp_path, env=env).stdout)
    libtorch = next(c for c in probe["checks"] if c["name"] == "libtorch")
    assert libtorch["status"] == "error" and "fdl libtorch remove precompiled/cu130" in libtorch["hint"]

    repaired = run_fdl("libtorch", "remove", "cu130", cwd=tmp_path, env=env)
    assert repaired.returncode == 0, repaired.stderr
    assert "its .active named it: cleared" in repaired.stdout
    assert not (root / ".active").exists() and (root / "precompiled/cpu/lib").is_dir()
    probe = json.loads(run_fdl("probe", "--json", "--skip-mount", "--cpu", cwd=tmp_path, env=env).stdout)
    assert next(c for c in probe["checks"] if c["name"] == "libtorch")["status"] == "ok"
    assert "warning" not in run_fdl("libtorch", "list", cwd=tmp_path, env=env).stderr


def test_downloading_the_active_variant_again_does_not_say_activate_it(tmp_path: Path, mirror) -> None:
    """Regression: a second `fdl libtorch download cpu` of the active variant said "To use it: fdl libtorch
    activate cpu"."""
    home = tmp_path / "home"
    home.mkdir()
    env = env_for(home, FDL_LIBTORCH_MIRROR=mirror.url)
    first = run_fdl("libtorch", "download", "cpu", cwd=tmp_path, env=env)
    assert first.returncode == 0 and "now the active variant" in first.stdout, first.stderr
    again = run_fdl("libtorch", "download", "cpu", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert "It is the active variant." in again.stdout and "To use it" not in again.stdout
    assert json.loads(run_fdl("libtorch", "download", "cpu", "--json", cwd=tmp_path, env=env).stdout)["active"]
    (home / ".flodl/libtorch/.active").write_text("precompiled/cu130\n")
    other = run_fdl("libtorch", "download", "cpu", cwd=tmp_path, env=env)
    assert "To use it: fdl libtorch activate cpu" in other.stdout


def test_libtorch_naming_a_wheels_torch_directory_reads_its_version(tmp_path: Path) -> None:
    """Regression: LIBTORCH=.../site-packages/torch (a wheel's package: lib/, version.py, no .arch or
    build-version) resolved with no version and no variant."""
    torch_dir = tmp_path / "site-packages" / "torch"
    (torch_dir / "lib").mkdir(parents=True)
    (torch_dir / "lib" / "libtorch.so").write_bytes(b"")
    (torch_dir / "__init__.py").write_text("")
    (torch_dir / "version.py").write_text("__version__ = '2.13.0+cu130'\ncuda: Optional[str] = '13.0'\n"
                                          "hip: Optional[str] = None\n")
    home = tmp_path / "home"
    home.mkdir()
    env = env_for(home, LIBTORCH=str(torch_dir))
    info = json.loads(run_fdl("libtorch", "info", "--json", cwd=tmp_path, env=env).stdout)["libtorch"]
    assert (info["version"], info["variant"], info["cuda"], info["source"], info["path"]) == (
        "2.13.0", "cu130", "13.0", "LIBTORCH", str(torch_dir))
    probe = json.loads(run_fdl("probe", "--json", "--skip-mount", "--cpu", cwd=tmp_path, env=env).stdout)
    check = next(c for c in probe["checks"] if c["name"] == "libtorch")
    assert check["data"]["version"] == "2.13.0" and check["data"]["source"] == "LIBTORCH"


def test_the_environments_pytorch_is_the_last_resort(tmp_path: Path) -> None:
    """torch/lib of this Python environment is found (without importing torch) when nothing else is."""
    torch = pytest.importorskip("torch")  # the test environment installs PyTorch 2.13.0 (pyproject test extras)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "LIBTORCH": "", "LIBTORCH_PATH": ""}
    listed = json.loads(run_fdl("libtorch", "list", "--json", cwd=tmp_path, env=env).stdout)
    [row] = listed["variants"]
    assert row["scope"] == "pytorch" and row["path"] == str(Path(torch.__file__).parent)
    assert row["version"] == torch.__version__.split("+")[0]
    assert row["variant"] == ("cpu" if torch.version.cuda is None else "cu" + torch.version.cuda.replace(".", ""))
    probe = json.loads(run_fdl("probe", "--json", "--skip-mount", cwd=tmp_path, env=env).stdout)
    check = next(c for c in probe["checks"] if c["name"] == "libtorch")
    assert check["data"]["source"] == "pytorch" and "torch/version.py" in check["data"]["metadata"]


# --------------------------------------------------------------------------- hints name real commands

# Prose that starts with "fdl" without naming a command ("fdl cannot read ...").
PROSE = {"cannot", "controller", "downloads", "only", "puts", "supervisor"}
MENTION = re.compile(r"(?:^|[(`:]\s?)fdl (?:@\w+ )?([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")


def mentioned_commands() -> list[tuple[str, str | None, str]]:
    """(command, next word, file) for every `fdl WORD` a string in fdl/ names as a command."""
    out = []
    for path in sorted((REPO / "fdl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out += [(m[1], m[2], str(path.relative_to(REPO))) for m in MENTION.finditer(node.value)]
    return out


def test_every_fdl_command_a_message_names_exists() -> None:
    with warnings.catch_warnings():  # this click warns that typer imports a name it deprecates
        warnings.simplefilter("ignore", DeprecationWarning)
        import click
        import typer

        from fdl.cli.main import BUILTINS, app

    root = typer.main.get_command(app)
    mentions = mentioned_commands()
    assert any(name == "libtorch" and sub == "download" for name, sub, _ in mentions)  # the probe's hint
    wrong = []
    for name, sub, where in mentions:
        if name in PROSE:
            continue
        if name not in BUILTINS:
            wrong.append(f"fdl {name} ({where})")
            continue
        command = root.get_command(click.Context(root), name)
        if isinstance(command, click.Group) and sub and sub not in command.commands:
            wrong.append(f"fdl {name} {sub} ({where})")
    assert not wrong, "messages name commands that do not exist: " + ", ".join(wrong)


def test_a_terminal_gets_a_progress_bar(tmp_path: Path, mirror) -> None:
    import sys

    import pexpect

    from tests.conftest import fdl_env

    url = mirror.url
    home = tmp_path / "home"
    home.mkdir()
    child = pexpect.spawn(sys.executable, ["-m", "fdl", "libtorch", "download", "--cpu"], cwd=str(tmp_path),
                          env=fdl_env(env_for(home, FDL_LIBTORCH_MIRROR=url)), encoding="utf-8", timeout=60)
    try:
        child.expect(r"cpu: \[#{30}\] \d+\.\d/\d+\.\d MiB")  # the whole archive, against its Content-Length
        child.expect("is installed in")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    other = tmp_path / "other-home"
    other.mkdir()
    piped = run_fdl("libtorch", "download", "--cpu", cwd=tmp_path, env=env_for(other, FDL_LIBTORCH_MIRROR=url))
    assert piped.returncode == 0 and "downloading" in piped.stderr
    assert "[#" not in piped.stderr and "\r" not in piped.stderr  # a pipe or a log gets no bar
