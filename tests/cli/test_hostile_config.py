"""Hostile configuration files: each is one clear error paragraph and exit 1, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_fdl

BOMB = """
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""

CASES = {
    "invalid_yaml": (b"cluster:\n  controller: {host: a\n", r"fdl.yml:\d+:\d+: invalid YAML"),
    "tab_indent": (b"cluster:\n\tcontroller: x\n", r"fdl.yml:2:1: invalid YAML"),
    "wrong_type": (b"cluster:\n  controller:\n    port: [1, 2]\n",
                   r"fdl.yml:3: cluster.controller.port: expected a TCP port from 1 to 65535, found a list"),
    "list_document": (b"- a\n- b\n", r"fdl.yml:1: the document is a list"),
    "scalar_document": (b"just words\n", r"fdl.yml:1: the document is a single value"),
    "non_utf8": (b"commands:\n  test: {run: \"echo \xff\xfe\"}\n", r"fdl.yml:2: the file is not valid UTF-8"),
    "alias_bomb": (BOMB.encode(), r"more than 100,000 values once its aliases"),
    "recursive_alias": (b"a: &x [1, *x]\n", r"fdl.yml:1: (an alias refers to a value that contains it|invalid YAML)"),
    "duplicate_keys": (b"commands:\n  test: {run: a}\n  test: {run: b}\n", r"fdl.yml:3: duplicate key 'test'"),
    "shell_host": (b"cluster:\n  workers:\n    - host: \"a;reboot\"\n",
                   r"fdl.yml:3: cluster.workers\[0\].host: expected a host name"),
    "space_host": (b"cluster:\n  controller: {host: \"my host\"}\n", r"cluster.controller.host: expected a host name"),
    "port_range": (b"cluster:\n  ssh: {port: 65536}\n", r"fdl.yml:2: cluster.ssh.port: expected a TCP port"),
    "negative_port": (b"cluster:\n  workers: [{host: a, port: -1}]\n",
                      r"cluster.workers\[0\].port: expected a TCP port"),
    "deep_nesting": (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", r"nesting depth|nested"),
    "nesting_past_limit": (b"a: " + b"[" * 80 + b"]" * 80 + b"\n", r"nested more than 64 levels deep"),
    "nul_bytes": (b"commands: {}\n\x00\n", r"NUL bytes"),
    "python_tag_key": (b"!!python/object:os.system x: 1\n", r"fdl.yml:1: cannot read the key"),
    "python_tag_value": (b"commands: !!python/object/apply:os.system [id]\n",
                         r"fdl.yml:1: the tag 'tag:yaml.org,2002:python/object/apply:os.system' is not supported"),
    "multiple_documents": (b"commands: {}\n---\ncommands: {}\n", r"invalid YAML"),
}


# documents that read as YAML but do not validate: the rest do not even read
READS_BUT_INVALID = {"wrong_type", "shell_host", "space_host", "port_range", "negative_port"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_a_clear_error(tmp_path: Path, case: str) -> None:
    content, pattern = CASES[case]
    (tmp_path / "fdl.yml").write_bytes(content)
    result = run_fdl("config", "show", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    if case in READS_BUT_INVALID:  # config show prints such a document, its error marked (issue 38 item 13)
        assert "(error: " in result.stdout
    else:
        assert result.stdout == ""
    assert result.stderr.startswith("fdl: error: ")
    import re

    assert re.search(pattern, result.stderr), result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2  # one paragraph (+ hint)


def test_fifty_megabyte_file_is_refused_without_reading(tmp_path: Path) -> None:
    path = tmp_path / "fdl.yml"
    with path.open("wb") as handle:
        handle.write(b"commands:\n")
        handle.truncate(50 * 1024 * 1024)
    result = run_fdl("config", "show", cwd=tmp_path)
    assert result.returncode == 1
    assert "fdl.yml is 50.0 MiB; fdl reads configuration files of up to 4 MiB" in result.stderr
    assert "Traceback" not in result.stderr


def test_hostile_overlay_names_the_overlay(tmp_path: Path) -> None:
    (tmp_path / "fdl.yml").write_text("commands: {}\n")
    (tmp_path / "fdl.cluster.yml").write_text("cluster:\n  controller:\n    port: seventy\n")
    result = run_fdl("@cluster", "config", "show", cwd=tmp_path)
    assert result.returncode == 1
    assert "fdl.cluster.yml:3: cluster.controller.port: expected a TCP port from 1 to 65535, found 'seventy'" \
        in result.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "fdl.yml").write_bytes(b"- a\n")
    result = run_fdl("--debug", "config", "show", cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "ConfigError" in result.stderr
