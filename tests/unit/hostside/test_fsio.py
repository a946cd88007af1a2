"""fdl.hostside.fsio's directory installer and its kin, on real directories: a tree goes into place whole, an
earlier one is exchanged for it with no moment without one, a taken place is never silently overwritten, and
nothing is left beside the target."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from fdl.hostside import fsio


def tree(root: Path, marker: str) -> Path:
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "marker").write_text(marker)
    (root / "lib" / "link").symlink_to("marker")
    (root / "dangling").symlink_to("/nonexistent/fdl-test")  # fsynced as a link, never followed
    return root


def test_a_staged_tree_goes_into_place_whole(tmp_path):
    target = tmp_path / "v1"
    with fsio.staging_dir(target) as staged:
        assert Path(staged).parent == tmp_path and Path(staged).name.startswith(".v1.")
        assert stat.S_IMODE(os.stat(staged).st_mode) == 0o700
        tree(Path(staged), "new")
        assert fsio.install_dir(staged, target) is False
    assert (target / "lib" / "link").read_text() == "new"
    assert os.readlink(target / "dangling") == "/nonexistent/fdl-test"
    assert [p.name for p in tmp_path.iterdir()] == ["v1"]  # the staging name is gone


@pytest.mark.parametrize("there", ["a tree", "an empty directory", "a file"])
def test_a_taken_place_is_refused_without_replace(tmp_path, there):
    """os.rename alone would silently put the new tree over an empty directory."""
    target = tmp_path / "v1"
    if there == "a file":
        target.write_text("old")
    elif there == "a tree":
        tree(target, "old")
    else:
        target.mkdir()
    staged = tree(tmp_path / ".v1.staged", "new")
    with pytest.raises(FileExistsError):
        fsio.install_dir(staged, target)
    assert (staged / "lib" / "marker").read_text() == "new"  # nothing moved
    assert (target / "lib" / "marker").read_text() == "old" if there == "a tree" else target.exists()


def test_replace_exchanges_and_deletes_the_earlier_tree(tmp_path):
    target = tree(tmp_path / "v1", "old")
    (target / "stale").write_text("from the earlier build")
    staged = tree(tmp_path / ".v1.staged", "new")
    assert fsio.install_dir(staged, target, replace=True) is True
    assert (target / "lib" / "marker").read_text() == "new" and not (target / "stale").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["v1"]


def test_readers_never_see_the_place_empty_while_trees_are_replaced(tmp_path):
    """The earlier tree stays until the new one is in: a reader polling the target never misses it."""
    target = tree(tmp_path / "v1", "0")
    stop = threading.Event()
    gaps = []

    def read() -> None:
        while not stop.is_set():
            try:
                (target / "lib" / "marker").read_text()
            except FileNotFoundError:
                gaps.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(1, 60):
            fsio.install_dir(tree(tmp_path / f".v1.{n}", str(n)), target, replace=True, sync=False)
    finally:
        stop.set()
        reader.join()
    assert gaps == []
    assert (target / "lib" / "marker").read_text() == "59"


def test_where_the_kernel_cannot_exchange_the_earlier_tree_is_moved_aside_first(tmp_path, monkeypatch):
    """A kernel or file system without renameat2 (the seam stands in for one): the same result, by two renames."""
    monkeypatch.setattr(fsio, "_renameat2", lambda src, dst, flags: False)
    target = tree(tmp_path / "v1", "old")
    assert fsio.install_dir(tree(tmp_path / ".v1.staged", "new"), target, replace=True) is True
    assert (target / "lib" / "marker").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["v1"]
    with pytest.raises(FileExistsError):
        fsio.install_dir(tree(tmp_path / ".v1.again", "x"), target)


def test_a_move_between_directories_of_one_file_system(tmp_path):
    """publish carries a release's build output (target/) from the live slot to the next one."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    here = tree(tmp_path / "a" / "target", "cache")
    (tmp_path / "b" / "target").write_text("a file in the way")
    assert fsio.install_dir(here, tmp_path / "b" / "target", replace=True, sync=False) is True
    assert (tmp_path / "b" / "target" / "lib" / "marker").read_text() == "cache"
    assert list((tmp_path / "a").iterdir()) == []


def test_the_staging_directory_goes_when_the_build_fails(tmp_path):
    with pytest.raises(RuntimeError), fsio.staging_dir(tmp_path / "v1", suffix=".tmp") as staged:
        assert staged.endswith(".tmp")
        tree(Path(staged), "half")
        raise RuntimeError("the build failed")
    assert list(tmp_path.iterdir()) == []


def test_retire_takes_a_tree_out_of_place_in_one_rename(tmp_path):
    target = tree(tmp_path / "v1", "old")
    hidden = Path(fsio.retire_dir(target, suffix=".removing.tmp"))
    assert not target.exists() and hidden.parent == tmp_path
    assert hidden.name.startswith(".v1.") and hidden.name.endswith(".removing.tmp")
    assert (hidden / "lib" / "marker").read_text() == "old"


def test_a_link_is_replaced_in_one_rename(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    link = tmp_path / "tree"
    fsio.atomic_symlink(link, "a", suffix=".tmp")
    fsio.atomic_symlink(link, "b", suffix=".tmp")
    assert os.readlink(link) == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "tree"]


def test_the_write_probe_says_what_stopped_it(tmp_path):
    assert fsio.write_probe(tmp_path / "new" / "dir") is None
    assert list((tmp_path / "new" / "dir").iterdir()) == []  # the probe file is gone
    (tmp_path / "file").write_text("")
    failed = fsio.write_probe(tmp_path / "file" / "below")
    assert isinstance(failed, OSError) and failed.filename is not None
