"""`fdl libtorch`: list, download (from a real HTTP mirror on loopback), activate, info; and the
probe finding what was activated. Also: every `fdl ...` command a hint names exists."""

from __future__ import annotations

import ast
import functools
import hashlib
import http.server
import io
import json
import re
import threading
import warnings
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, run_fdl


def make_archive(torch_version: str = "2.13.0+cpu") -> bytes:
    """A small libtorch zip in PyTorch's layout: one top-level libtorch/ with lib/ and build-version."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("libtorch/lib/libtorch.so", b"\x7fELF not really\n")
        zf.writestr("libtorch/include/torch/torch.h", b"// header\n")
        zf.writestr("libtorch/build-version", torch_version + "\n")
    return buf.getvalue()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def mirror(tmp_path: Path):
    """A real HTTP server on 127.0.0.1 serving libtorch-cpu.zip and its .sha256 (sha256sum's format)."""
    root = tmp_path / "mirror"
    root.mkdir()
    archive = make_archive()
    (root / "libtorch-cpu.zip").write_bytes(archive)
    (root / "libtorch-cpu.zip.sha256").write_text(f"{hashlib.sha256(archive).hexdigest()}  libtorch-cpu.zip\n")
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def env_for(home: Path, **extra: str) -> dict:
    # FDL_LIBTORCH_FROM_PYTORCH=0: the test venv's own PyTorch would otherwise be found last.
    return {"HOME": str(home), "FDL_LIBTORCH_FROM_PYTORCH": "0", "LIBTORCH": "", "LIBTORCH_PATH": "", **extra}


def test_list_download_activate_then_probe_finds_it(tmp_path: Path, mirror) -> None:
    _, url = mirror
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = env_for(home, FDL_LIBTORCH_MIRROR=url)

    empty = run_fdl("libtorch", "list", cwd=project, env=env)
    assert empty.returncode == 0 and "No libtorch variant is installed" in empty.stdout
    assert "fdl libtorch download" in empty.stdout

    got = run_fdl("libtorch", "download", "--cpu", cwd=project, env=env)
    assert got.returncode == 0, got.stderr
    variant = home / ".flodl" / "libtorch" / "precompiled" / "cpu"
    assert (variant / "lib" / "libtorch.so").is_file()
    assert "sha256 verified" in got.stderr and "now the active variant" in got.stdout
    assert (home / ".flodl" / "libtorch" / ".active").read_text().strip() == "precompiled/cpu"

    listed = json.loads(run_fdl("libtorch", "list", "--json", cwd=project, env=env).stdout)
    [row] = listed["variants"]
    assert (row["label"], row["scope"], row["version"], row["variant"], row["active_in_root"], row["in_use"]) == \
        ("precompiled/cpu", "home", "2.13.0", "cpu", True, True)

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
                                        "downloaded": False, "activated": False}


def test_a_checksum_mismatch_installs_nothing(tmp_path: Path, mirror) -> None:
    root, url = mirror
    (root / "libtorch-cpu.zip.sha256").write_text("0" * 64 + "  libtorch-cpu.zip\n")
    home = tmp_path / "home"
    home.mkdir()
    result = run_fdl("libtorch", "download", "--cpu", cwd=tmp_path, env=env_for(home, FDL_LIBTORCH_MIRROR=url))
    assert result.returncode == 1
    assert "failed its checksum" in result.stderr and "Nothing was installed" in result.stderr
    libroot = home / ".flodl" / "libtorch"
    assert not (libroot / "precompiled" / "cpu").exists() and not (libroot / ".active").exists()
    assert not [p for p in (libroot / "precompiled").iterdir()]  # no temp file or half-unpacked tree left


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
    assert "hint: Check the mirror URL" in result.stderr


def test_no_mirror_and_bad_names_are_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    none = run_fdl("libtorch", "download", "--cpu", cwd=tmp_path, env=env_for(home, FDL_LIBTORCH_MIRROR=""))
    assert none.returncode == 2 and "no libtorch mirror is configured" in none.stderr
    assert "--mirror" in none.stderr and "FDL_LIBTORCH_MIRROR" in none.stderr
    bad = run_fdl("libtorch", "download", "cu999", "--mirror", "http://127.0.0.1:9", cwd=tmp_path,
                  env=env_for(home))
    assert bad.returncode == 1 and "'cu999' is not one of them" in bad.stderr
    missing = run_fdl("libtorch", "activate", "cu128", cwd=tmp_path, env=env_for(home))
    assert missing.returncode == 1 and "precompiled/cu128 is not installed" in missing.stderr
    assert "fdl libtorch download cu128" in missing.stderr


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

    _, url = mirror
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
