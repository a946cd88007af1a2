"""The parsed-config cache of fdl.config.source: same answer as a parse, never a stale one, never in the way."""

from __future__ import annotations

import datetime
import marshal
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fdl.config.source
import fdl.config.yamldoc
from fdl.config.source import read_layer
from fdl.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]

DOCUMENT = textwrap.dedent("""\
    defaults: &defaults {port: 1337, ratio: 0.5, big: 123456789012345678901, limit: .inf, enabled: true}
    cluster:
      controller:
        <<: *defaults
        host: 10.0.0.1
        label: "0755"
      workers:
        - {host: node-b, local_devices: [0, 1], note: null}
        - host: "nöde-ç"
          mode: 0755
    commands:
      test: {run: cargo test, description: "quotes ' and \\" and \\u2603"}
    """)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("FDL_CONFIG_CACHE", raising=False)  # the suite's own: these tests look at fdl's default
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache" / "fdl" / "config"


def no_parse(*args: object, **kwargs: object) -> None:
    raise AssertionError("parsed again: the cache entry was not used")


def test_a_cached_read_gives_what_the_parse_gave(tmp_path: Path, cache: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "fdl.yml"
    path.write_text(DOCUMENT)
    parsed = read_layer(path)
    assert [p.stat().st_mode & 0o777 for p in cache.iterdir()] == [0o600]
    monkeypatch.setattr(fdl.config.yamldoc, "parse_text", no_parse)
    cached = read_layer(path)
    assert cached.data == parsed.data and list(cached.data) == list(parsed.data)
    assert cached.origins == parsed.origins and list(cached.origins) == list(parsed.origins)
    assert cached.data["cluster"]["controller"]["port"] == 1337
    assert cached.data["cluster"]["workers"][1]["mode"] == "0755"
    assert type(cached.data["cluster"]["controller"]["enabled"]) is bool


def test_an_edit_is_parsed_again_even_with_the_same_size_and_time(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "fdl.yml"
    path.write_text("commands:\n  test: {run: one}\n")
    before = path.stat()
    assert read_layer(path).data["commands"]["test"]["run"] == "one"
    path.write_text("commands:\n  test: {run: two}\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert read_layer(path).data["commands"]["test"]["run"] == "two"
    assert len(list(cache.iterdir())) == 1  # one entry per file, replaced
    path.write_text("commands:\n  test: {run: [two\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        read_layer(path)


def test_a_changed_parser_parses_again(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "fdl.yml"
    path.write_text(DOCUMENT)
    read_layer(path)
    calls: list[str] = []
    parse = fdl.config.yamldoc.parse_text
    monkeypatch.setattr(fdl.config.yamldoc, "parse_text", lambda *a, **k: calls.append("parse") or parse(*a, **k))
    read_layer(path)
    assert calls == []
    monkeypatch.setattr(fdl.config.source, "_parser_stamp", lambda: [[1, 2], [3, 4]])
    read_layer(path)
    read_layer(path)
    assert calls == ["parse"]


def test_the_spelling_of_the_file_is_part_of_the_entry(tmp_path: Path, cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    path = tmp_path / "fdl.yml"
    path.write_text("commands:\n  test: {run: one}\n")
    assert str(read_layer(path).origins[("commands",)]) == "fdl.yml:1"
    monkeypatch.chdir(tmp_path / "sub")
    assert str(read_layer(path).origins[("commands",)]) == f"{path}:1"


def test_a_damaged_entry_costs_only_a_parse(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "fdl.yml"
    path.write_text(DOCUMENT)
    parsed = read_layer(path)
    (entry,) = cache.iterdir()
    for damage in (b"\xff not marshal", marshal.dumps([]), marshal.dumps({"stamp": 1}), entry.read_bytes()[:-9]):
        entry.write_bytes(damage)
        again = read_layer(path)
        assert again.data == parsed.data and again.origins == parsed.origins
    read_layer(path)
    stored = marshal.loads(entry.read_bytes())
    stored["data"] = ["not", "a", "mapping"]
    entry.write_bytes(marshal.dumps(stored))
    assert read_layer(path).data == parsed.data


def test_values_json_cannot_carry_are_not_cached(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "fdl.yml"
    path.write_text("when: 2024-01-02\n1: one\n")
    for _ in range(2):
        data = read_layer(path).data
        assert data == {"when": datetime.date(2024, 1, 2), 1: "one"}
    assert not cache.exists() or not list(cache.iterdir())


@pytest.mark.parametrize("text", [
    "cluster:\n  controller:\n    join: {token: 0123abcd}\n",
    "commands:\n  test: {run: x, env: {HF_TOKEN: hf_abc}}\n",
    "commands:\n  test: {run: x, description: '-----BEGIN OPENSSH PRIVATE KEY-----'}\n",
    "commands:\n  test: {run: x, env: {AWS_SECRET_ACCESS_KEY: abc}}\n",
    "commands:\n  test: {run: 'psql postgres://u:pw@db/x'}\n",
    "commands:\n  test: {run: x, args: [--wandb-key, wk_abc]}\n",
])
def test_a_document_holding_a_secret_is_not_copied_into_the_cache(tmp_path: Path, cache: Path, text: str) -> None:
    path = tmp_path / "fdl.yml"
    path.write_text(text)
    read_layer(path)
    assert not cache.exists() or not list(cache.iterdir())


def test_fdl_config_cache_names_the_directory(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FDL_CONFIG_CACHE", str(tmp_path / "elsewhere"))
    path = tmp_path / "fdl.yml"
    path.write_text(DOCUMENT)
    read_layer(path)
    assert len(list((tmp_path / "elsewhere").iterdir())) == 1 and not cache.exists()


def test_an_unwritable_cache_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FDL_CONFIG_CACHE", raising=False)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    path = tmp_path / "fdl.yml"
    path.write_text(DOCUMENT)
    assert read_layer(path).data == read_layer(path).data


def test_a_command_reading_an_unchanged_config_does_not_import_yaml(tmp_path: Path) -> None:
    text = "cluster:\n  controller: {host: 10.0.0.1}\ncommands:\n  test: {run: cargo test}\n"
    (tmp_path / "fdl.yml").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO), "FDL_CONFIG_CACHE": str(tmp_path / "cache")}
    code = ("import sys; from pathlib import Path; from fdl.config.project import EnvSelection, load_config; "
            "load_config(Path.cwd(), EnvSelection.choose(None, None)); print('yaml' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60) for _ in range(2)]
    assert [r.stdout.strip() for r in runs] == ["True", "False"], [r.stderr for r in runs]


def _entry_with(path: Path, cache: Path, run: str) -> Path:
    """Rewrite the one cache entry so that it claims `run` for the file's unchanged text (a forged entry)."""
    (entry,) = cache.iterdir()
    forged = marshal.loads(entry.read_bytes())
    forged["data"]["commands"]["test"]["run"] = run
    entry.write_bytes(marshal.dumps(forged))
    return entry


def test_an_entry_others_could_write_is_not_trusted(tmp_path: Path, cache: Path) -> None:
    # regression: marshal is safe only for data its own reader wrote, so an entry in a file or a directory
    # that another user may write is ignored and the file parsed again.
    path = tmp_path / "fdl.yml"
    path.write_text("commands:\n  test: {run: one}\n")
    read_layer(path)
    entry = _entry_with(path, cache, "forged")
    assert read_layer(path).data["commands"]["test"]["run"] == "forged"  # the owner's own entry is used
    _entry_with(path, cache, "forged")
    entry.chmod(0o620)
    assert read_layer(path).data["commands"]["test"]["run"] == "one"
    _entry_with(path, cache, "forged")
    entry.chmod(0o600)
    cache.chmod(0o777)
    try:
        assert read_layer(path).data["commands"]["test"]["run"] == "one"
    finally:
        cache.chmod(0o700)
