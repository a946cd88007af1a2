"""Shared pieces of the launcher tests: a torch interpreter other users can run, projects, rank output."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from tests.conftest import IN_CI, REPO

DEMO = REPO / "examples" / "quickstart" / "train.py"
PORTS = range(26000, 27000)  # this suite's ports
CHECKSUM = re.compile(r"^\[(?P<host>[^/\]]+)/(?P<rank>\d+)\] rank (?P=rank)/(?P<size>\d+) on (?P<on>\S+): .*"
                      r"weights checksum (?P<sum>[0-9a-f]{16})$")


def free_port(host: str = "127.0.0.1") -> int:
    """A port in this suite's range whose next one is free too (the controller's, and rank 0's rendezvous)."""
    import random

    from fdl.controller.listen import port_free

    candidates = list(PORTS)[:-1]
    random.shuffle(candidates)
    for port in candidates:
        if port_free(host, port) and port_free(host, port + 1):  # in every family the bind holds
            return port
    raise RuntimeError("no free port pair in 26000-26999")


def torch_python(where: Path) -> Path:
    """A python3 with torch that any user can run: a venv of /usr/bin/python3 that sees this suite's packages.

    The suite's own interpreter may live where other accounts cannot enter (/root); its site-packages is
    readable, and a .pth file in a world-readable venv adds it to that venv's path.
    """
    base = Path("/usr/bin/python3")
    site = Path(sysconfig.get_paths()["purelib"])
    probe = subprocess.run([str(base), "-c", "import sys; print(*sys.version_info[:2], sep='.')"],
                           capture_output=True, text=True, check=False)
    wanted = "{}.{}".format(*sys.version_info[:2])
    if probe.returncode != 0 or probe.stdout.strip() != wanted:
        reason = f"/usr/bin/python3 is not Python {wanted}, so it cannot load this suite's torch for other users"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    venv = where / "torchpy"
    if not (venv / "bin" / "python3").exists():
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
        lib = next((venv / "lib").glob("python3*")) / "site-packages"
        (lib / "fdl-test-torch.pth").write_text(str(site) + "\n")
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return venv / "bin" / "python3"


def fdl_python(where: Path) -> Path:
    """torch_python that also imports this checkout's fdl: what another account runs `python -m fdl` with."""
    python = torch_python(where)
    lib = next((where / "torchpy" / "lib").glob("python3*")) / "site-packages"
    (lib / "fdl-test-checkout.pth").write_text(str(REPO) + "\n")
    (lib / "fdl-test-checkout.pth").chmod(0o644)
    return python


def train_script(directory: Path, python: Path) -> Path:
    """The quickstart's train.py under a shebang for `python` (what every rank runs)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "train.py"
    script.write_text(f"#!{python}\n" + DEMO.read_text())
    script.chmod(0o755)
    return script


def write_project(root: Path, commands: dict, cluster: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "fdl.yml").write_text(yaml.safe_dump({"commands": commands}, sort_keys=False))
    if cluster is not None:
        (root / "fdl.cluster.yml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    return root


def checksums(stdout: str) -> dict[int, dict]:
    """rank -> {host, size, sum} from the demo's final lines."""
    found = {}
    for line in stdout.splitlines():
        match = CHECKSUM.match(line.strip())
        if match:
            found[int(match["rank"])] = {"host": match["host"], "size": int(match["size"]), "sum": match["sum"]}
    return found


def final_state(home: Path) -> dict:
    """The state.json the launcher kept of its (only) run under this HOME."""
    import json

    runs = sorted((home / ".flodl" / "launch" / "runs").glob("*/state.json"), key=lambda p: p.stat().st_mtime)
    assert runs, f"no kept state.json under {home}"
    return json.loads(runs[-1].read_text())


def run_processes(host) -> list[str]:
    """The host user's processes of a launcher run (FDL_RUN_ID in their environment) or running the rank
    supervisor or train.py: what must be gone when the launcher has exited."""
    import pwd

    uid = pwd.getpwnam(host.user).pw_uid
    found = []
    for pid in host.pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ours = any(item.startswith(b"FDL_RUN_ID=") for item in environ)
        if ours or "supervisor.py" in cmdline or "train.py" in cmdline:
            found.append(f"{pid}: {cmdline.strip()}")
    return found


def cleanup_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
