"""The run manifest: written atomically with every field, read back and validated."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from fdl.errors import ExitCode
from fdl.hostside.fsio import TEMP_SUFFIX
from fdl.publish.manifest import (
    FIELDS,
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    ManifestMissing,
    check_tree_path,
    new_run_id,
    read_manifest,
    remove_manifest,
    write_manifest,
)


def sample(**over) -> Manifest:
    base = dict(bin="target/release/train", run=new_run_id(), published_epoch=1_700_000_000, built=True,
                cwd="ddp-bench", build="cargo build --release --bin train", args=("--model", "resnet", ""),
                origin="file:///home/op/rdl", rustc="rustc 1.95.0")
    base.update(over)
    return Manifest(**base)


def test_written_manifest_has_exactly_the_documented_fields(tmp_path: Path) -> None:
    manifest = sample()
    path = write_manifest(tmp_path, manifest)
    assert path == tmp_path / MANIFEST_NAME
    data = yaml.safe_load(path.read_text())
    assert list(data) == list(FIELDS)
    assert data["args"] == ["--model", "resnet", ""]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert read_manifest(tmp_path) == manifest
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_NAME]  # no temp file left behind


def test_run_ids_are_fresh_hex_nonces() -> None:
    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_missing_manifest_is_none_or_transient(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) is None
    with pytest.raises(ManifestMissing) as info:
        read_manifest(tmp_path, required=True)
    assert info.value.exit_code == ExitCode.FAILURE
    assert "no run is published" in info.value.message


def test_remove_takes_the_manifest_and_stale_temp_files(tmp_path: Path) -> None:
    write_manifest(tmp_path, sample())
    (tmp_path / f"{MANIFEST_NAME}.abc123.tmp").write_text("half")  # left by fdl before fdl.hostside.fsio
    (tmp_path / f".{MANIFEST_NAME}.k2j4h1{TEMP_SUFFIX}").write_text("half")  # left by fdl.hostside.fsio.atomic_write
    (tmp_path / "keep.txt").write_text("x")
    assert remove_manifest(tmp_path) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    assert remove_manifest(tmp_path) is False


@pytest.mark.parametrize("text, says", [
    ("- a\n- b\n", "expected a mapping"),
    ("bin: x\nrun: abcdefabcdefabcdef\npublished_epoch: 1\n", "'built' is missing"),
    ("bin: x\nrun: nothex!\npublished_epoch: 1\nbuilt: true\n", "hex nonce"),
    ("bin: x\nrun: abcdefabcdefabcdef\npublished_epoch: soon\nbuilt: true\n", "unix seconds"),
    ("bin: x\nrun: abcdefabcdefabcdef\npublished_epoch: 1\nbuilt: yes please\n", "true or false"),
    ("bin: x\nrun: abcdefabcdefabcdef\npublished_epoch: 1\nbuilt: true\nargs: --model\n", "list of text"),
    ("bin: /usr/bin/x\nrun: abcdefabcdefabcdef\npublished_epoch: 1\nbuilt: true\n", "absolute"),
    ("bin: ../../x\ncwd: sub\nrun: abcdefabcdefabcdef\npublished_epoch: 1\nbuilt: true\n", "climbs out"),
    ("bin: [x\n", "YAML error at line"),
])
def test_invalid_manifests_are_refused_with_the_reason(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / MANIFEST_NAME).write_text(text)
    with pytest.raises(ManifestError) as info:
        read_manifest(tmp_path)
    assert says in info.value.message
    assert str(tmp_path / MANIFEST_NAME) in info.value.message
    assert "fdl publish" in (info.value.hint or "")


def test_defaults_fill_optional_fields_and_unknown_keys_are_tolerated(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text(
        "bin: ../target/release/m\ncwd: member\nrun: abcdefabcdefabcdef\npublished_epoch: 5\nbuilt: false\n"
        "future_field: 1\n")
    manifest = read_manifest(tmp_path)
    assert manifest is not None
    assert (manifest.cwd, manifest.build, manifest.args, manifest.built) == (
        "member", "cargo build --release", (), False)


@pytest.mark.parametrize("value, base, ok", [
    ("target/release/x", ".", True), ("../target/release/x", "member", True), ("a/./b/", ".", True),
    ("../x", ".", False), ("/abs", ".", False), ("~/x", ".", False), ("", ".", False),
    ("a/../../x", "b", True), ("a/../../../x", "b", False),
])
def test_tree_paths_must_stay_inside(value: str, base: str, ok: bool) -> None:
    if ok:
        check_tree_path(value, "bin", base=base)
    else:
        with pytest.raises(ValueError):
            check_tree_path(value, "bin", base=base)
