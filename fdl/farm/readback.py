"""Read back what the render play wrote, before any of it is put in place.

Everything `fdl join-config` generates for someone else is parsed and checked against what the wizard meant
to write: a render that loses a key, comments one out or changes a value fails the wizard (exit 1, nothing
written), never a worker at boot. Each check parses the text with the reader its user runs:

- worker.yml (the worker's fdl.yml): fdl's own configuration reader and the join schema `fdl join` applies
  (fdl.config.schema.check_join), then every key and value of the join: block against the intended block,
  and the farm's shape marker that re-runs recover the farm from;
- cloud-init user-data: a YAML document that starts with `#cloud-config`, whose write_files carry exactly the
  worker's fdl.yml (checked as above), the key, the token, the door's known_hosts and the unit, each with its
  owner and mode, the account, and the runcmd that enables the unit; and, where cloud-init is installed, its
  own schema (`cloud-init schema --config-file`), judged by its exit status;
- known_hosts: exactly the door's pinned lines;
- the overlay: fdl's configuration reader and the cluster schema, its token_file: the farm's token file;
- the sshd drop-in: sshd's reading of it (fdl.hostside.farm.sshd_config) has the door's Port lines and Match
  blocks;
- the door self-test: `sh -n`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from fdl.config.schema import Checker, check_cluster, check_join
from fdl.config.yamldoc import parse_text
from fdl.errors import ConfigError, FdlError
from fdl.hostside.farm.sshd_config import scan

CLOUD_INIT_TIMEOUT_S = 120


def _refuse(name: str, problem: str) -> FdlError:
    return FdlError(f"the rendered {name} is not what fdl join-config meant to write: {problem.rstrip('.')}. "
                    f"Nothing was written; no worker would have booted from it.",
                    hint="this is a bug in a template (the fdl_join_worker or fdl_join_door role, or "
                         "templates/farm/): report it with the output of --debug", exit_code=1)


def _document(text: str, name: str) -> tuple[dict[Any, Any], Checker]:
    """The document parsed by fdl's configuration reader, and a Checker over it that reads no files (the
    paths it names are the worker's, not this box's)."""
    try:
        data, origins = parse_text(text, name, json_file=False)
    except ConfigError as exc:
        raise _refuse(name, exc.message) from None
    if not isinstance(data, dict):
        raise _refuse(name, "it is not a mapping of keys")
    return data, Checker(origins, [name], read_files=False)


def _verdict(name: str, checker: Checker) -> None:
    problems = checker.errors + checker.warnings
    if problems:
        raise _refuse(name, "; ".join(problems))


def check_worker_yml(text: str, expected: dict[str, Any], marker: dict[str, str], name: str = "worker.yml") -> None:
    """A worker's fdl.yml: the join schema holds, its join: block is exactly `expected`, and the shape marker
    (door, served, jail) reads back as `marker`."""
    from fdl.farm.wizard.shape import shape_marker

    data, checker = _document(text, name)
    if set(data) != {"join"}:
        raise _refuse(name, f"its top-level keys are {sorted(map(str, data))}, not just join:")
    block = data["join"]
    joined = checker.soft(None, check_join, checker, block)
    _verdict(name, checker)
    if joined is None or not isinstance(block, dict):
        raise _refuse(name, "its join: block does not check")
    missing = [key for key in expected if key not in block]
    extra = [str(key) for key in block if key not in expected]
    if missing or extra:
        parts = ([f"join.{', join.'.join(missing)} missing (lost or commented out)"] if missing else []) + \
            ([f"join.{', join.'.join(extra)} not meant to be there"] if extra else [])
        raise _refuse(name, "; ".join(parts))
    wrong = [key for key, value in expected.items() if block[key] != value]
    if wrong:
        raise _refuse(name, "; ".join(f"join.{key} reads back as {block[key]!r}, not {expected[key]!r}"
                                      for key in wrong if key not in ("token",)))
    found = shape_marker(text)
    if found != marker:
        raise _refuse(name, f"its fdl-farm-shape line reads back as {found}, not {marker} (re-runs recover the "
                            f"farm from it)")


def check_known_hosts(text: str, lines: list[str], name: str = "known_hosts") -> None:
    if [line for line in text.splitlines() if line.strip()] != lines:
        raise _refuse(name, "its lines are not the door's host keys")


def check_overlay(text: str, token_file: str, host: str, port: int, name: str) -> None:
    """The overlay parses, its cluster: block checks, and it names the farm's token file (and no token)."""
    data, checker = _document(text, name)
    cluster = checker.soft(None, check_cluster, checker, data.get("cluster"))
    _verdict(name, checker)
    if cluster is None:
        raise _refuse(name, "it has no cluster: block")
    join = ((data.get("cluster") or {}).get("controller") or {}).get("join") or {}
    if join.get("token_file") != token_file or "token" in join:
        raise _refuse(name, f"cluster.controller.join.token_file is not {token_file} (or a literal token is there)")
    if (cluster.controller.host, cluster.controller.port) != (host, port):
        raise _refuse(name, f"cluster.controller reads back as {cluster.controller.address}, not {host}:{port}")


def check_dropin(text: str, door_port: int, ports: list[int], jail_account: str | None,
                 name: str = "sshd-door.conf") -> None:
    """sshd's reading of the drop-in: its Port lines, the door's Match block, door a's Match User block."""
    with tempfile.TemporaryDirectory(prefix="fdl-readback-") as tmp:
        path = Path(tmp) / "door.conf"
        path.write_text(text, encoding="utf-8")
        found = scan(str(path))
    got_ports = found.ports()
    matches = [d.value for d in found.directives if d.keyword == "match"]
    if got_ports != ports:
        raise _refuse(name, f"its Port lines read back as {got_ports}, not {ports}")
    wanted = [f"LocalPort {door_port}"] + ([f"User {jail_account}"] if jail_account else [])
    if matches != wanted:
        raise _refuse(name, f"its Match blocks read back as {matches}, not {wanted}")


def check_selftest(text: str, name: str = "door-selftest.sh") -> None:
    """The self-test parses as a POSIX shell script (`sh -n`)."""
    try:
        done = subprocess.run(["/bin/sh", "-n"], input=text, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise _refuse(name, f"sh -n could not run ({exc})") from None
    if done.returncode != 0:
        raise _refuse(name, f"sh -n refuses it: {done.stderr.strip()}")


class CloudFile:
    """One file the user-data must write: its content, mode and owner (None: cloud-init's default, root)."""

    def __init__(self, content: str, permissions: str, owner: str | None = None, defer: bool = False):
        self.content, self.permissions, self.owner, self.defer = content, permissions, owner, defer


def check_cloud_init(text: str, files: dict[str, CloudFile], user: str, unit: str, secrets: tuple[str, ...] = (),
                     name: str = "cloud-init.yml") -> None:
    """The user-data: `#cloud-config`, the agent's account, exactly `files` in write_files (content, mode,
    owner), and the runcmd that enables the unit; then cloud-init's own schema where cloud-init is installed."""
    if not text.startswith("#cloud-config\n"):
        raise _refuse(name, "its first line is not #cloud-config, so cloud-init would not read it as user-data")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _refuse(name, f"it does not parse as YAML ({exc})") from None
    if not isinstance(data, dict):
        raise _refuse(name, "it is not a mapping of cloud-init modules")
    users = [u.get("name") for u in data.get("users") or [] if isinstance(u, dict)]
    if user not in users:
        raise _refuse(name, f"users: does not create the agent's account {user}")
    written = {entry.get("path"): entry for entry in data.get("write_files") or [] if isinstance(entry, dict)}
    if set(written) != set(files):
        lost = sorted(set(files) - set(written))
        extra = sorted(str(p) for p in set(written) - set(files))
        raise _refuse(name, f"write_files lacks {lost} and has {extra} besides")
    for path, want in files.items():
        entry = written[path]
        content = entry.get("content")
        if not isinstance(content, str) or content.rstrip("\n") != want.content.rstrip("\n"):
            raise _refuse(name, f"write_files {path}: its content is not the rendered file")
        if str(entry.get("permissions")) != want.permissions or entry.get("owner", None) != want.owner \
                or bool(entry.get("defer", False)) != want.defer:
            raise _refuse(name, f"write_files {path}: mode {entry.get('permissions')}, owner {entry.get('owner')}, "
                                f"defer {entry.get('defer', False)}; meant {want.permissions}, {want.owner}, "
                                f"{want.defer}")
    runcmd = [list(map(str, c)) if isinstance(c, list) else str(c) for c in data.get("runcmd") or []]
    if ["systemctl", "enable", "--now", unit] not in runcmd:
        raise _refuse(name, f"runcmd does not enable and start {unit}")
    schema_problem = cloud_init_schema(text, secrets)
    if schema_problem is not None:
        raise _refuse(name, f"cloud-init's own schema refuses it: {schema_problem}")


def cloud_init_tool() -> str | None:
    return shutil.which("cloud-init")


def cloud_init_schema(text: str, secrets: tuple[str, ...] = ()) -> str | None:
    """`cloud-init schema --config-file` on the text, where cloud-init is installed: None when it passes (or
    cannot be asked), else what it said, with every line of `secrets` (the key, the token) blotted out. Judged
    by its exit status; what it prints is only shown."""
    tool = cloud_init_tool()
    if tool is None:
        return None
    fd, path = tempfile.mkstemp(prefix="fdl-user-data-", suffix=".yml")  # 0600: the text holds secrets
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        done = subprocess.run([tool, "schema", "--config-file", path], capture_output=True, text=True,
                              timeout=CLOUD_INIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cloud-init schema could not run ({exc})"
    finally:
        os.unlink(path)
    if done.returncode == 0:
        return None
    said = (done.stderr + done.stdout).replace(path, "user-data")
    for secret in secrets:
        for part in secret.splitlines():
            if len(part.strip()) >= 8:
                said = said.replace(part.strip(), "(secret)")
    lines = [line for line in said.splitlines() if line.strip()]
    return "; ".join(lines[-6:]) or f"exit {done.returncode}"
