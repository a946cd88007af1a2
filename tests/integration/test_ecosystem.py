"""The Ansible ecosystem's own checks of the flodl.fdl collection, run as an Ansible user or Galaxy runs them: on
the tarball scripts/build-collection makes, installed with ansible-galaxy, offline.

- `ansible-test sanity` on every ansible-core line the collection claims (fdl.collection.ANSIBLE_CORE_LINES),
  each with that line's ansible-test on its controller Python, prepared once (tests/ecosystem.py);
- `ansible-lint --profile production` over the installed collection;
- galaxy-importer, Galaxy's import checks: no warning but the one it prints for each sanity ignore file (the
  collection is MIT, so validate-modules' GPLv3 header check is ignored on every line, the one entry Galaxy
  allows for it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, install_collection
from tests.ecosystem import SANITY_LINES, offline_prefix, prepare, run_sanity

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
# What the sanity run must have run (a test ansible-test skipped, or a line that ran nothing, fails).
SANITY_TESTS = ("ansible-doc", "changelog", "compile", "empty-init", "import", "pep8", "pylint", "runtime-metadata",
                "validate-modules", "yamllint")
IGNORED = "validate-modules:missing-gplv3-license"  # the one entry: MIT modules carry no GPLv3 header


def installed(tarball: Path, where: Path, python: Path | None = None) -> Path:
    """The tarball installed with ansible-galaxy; returns the collection's directory."""
    collections = install_collection(tarball, where / "collections", python=str(python) if python else None)
    return collections / "ansible_collections" / "flodl" / "fdl"


@pytest.mark.parametrize("line", list(SANITY_LINES))
def test_ansible_test_sanity_passes_on_every_claimed_line(line, short_tmp, collection_tarball):
    env, lock = prepare(line)
    try:
        root = installed(collection_tarball, short_tmp, env.bin / "python")
        version = subprocess.run([str(env.bin / "ansible"), "--version"], capture_output=True, text=True,
                                 timeout=120, env={"PATH": str(env.bin), "HOME": str(short_tmp)})
        assert f"[core {line}." in version.stdout, version.stdout
        done = run_sanity(env, root)
    finally:
        os.close(lock)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-8000:]
    for test in SANITY_TESTS:
        assert f'Running sanity test "{test}"' in out, f"{test} did not run:\n{out[-3000:]}"
    assert "ERROR:" not in out and "Downloading" not in out, out[-6000:]
    ignores = sorted(p.name for p in (root / "tests" / "sanity").glob("ignore-*.txt"))
    assert ignores == [f"ignore-{each}.txt" for each in SANITY_LINES], ignores
    for entry in (root / "tests" / "sanity" / f"ignore-{line}.txt").read_text().splitlines():
        assert entry.split()[1] == IGNORED, entry  # only what Galaxy allows (galaxy-importer below)


def test_ansible_lint_passes_on_the_installed_collection(short_tmp, collection_tarball):
    """The roles call the collection's own modules by FQCN, which is how ansible-lint resolves them there."""
    root = installed(collection_tarball, short_tmp)
    home = short_tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON", "XDG_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HOME=str(home), NO_COLOR="1", PY_COLORS="0",
               ANSIBLE_COLLECTIONS_PATH=str(root.parents[2]), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False")
    done = subprocess.run([*offline_prefix(), str(BIN / "ansible-lint"), "--profile", "production", "--offline",
                           "--nocolor"], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "Profile 'production' was required, and it passed" in out, out[-3000:]
    assert "unknown-module" not in out, out[-3000:]


def test_galaxy_importer_warns_only_of_the_allowed_sanity_ignores(short_tmp, collection_tarball):
    home = short_tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON", "XDG_", "GALAXY_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HOME=str(home), NO_COLOR="1",
               ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False")
    done = subprocess.run([*offline_prefix(), sys.executable, "-m", "galaxy_importer.main", str(collection_tarball)],
                          cwd=short_tmp, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "Importer processing completed successfully" in out, out[-3000:]
    assert "ansible-lint run complete" in out and "ansible-lint not found" not in out, out[-3000:]
    assert "ansible-doc not found" not in out, out[-3000:]
    warnings = sorted(line for line in out.splitlines() if line.startswith(("WARNING", "ERROR")))
    notice = "WARNING: Ignore files skip ansible-test sanity tests, found "
    assert [line for line in warnings if not line.startswith(notice)] == [], "\n".join(warnings)
    assert not re.search(r"sanity\[|syntax-check|unknown-module", out), out[-3000:]
    # Galaxy prints one notice per ignore file whatever it holds; only allowed entries are in them (its
    # ansible-lint run would flag any other as sanity[cannot-ignore], above)
    sanity = REPO / "collection" / "tests" / "sanity"
    counts = {line: len((sanity / f"ignore-{line}.txt").read_text().splitlines()) for line in SANITY_LINES}
    assert warnings == sorted(f"{notice}ignore-{line}.txt with {count} statement(s)"
                              for line, count in counts.items()), "\n".join(warnings)
