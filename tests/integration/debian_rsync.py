"""Debian 12's own rsync releases, unpacked from their packages, for tests that must hold on each.

Two releases count as Debian 12's rsync: 3.2.7 (what bookworm released with) and the 3.5.0 security
update. A machine has one of them installed; the tests run the other one too, as Debian ships it: the
package comes from apt (`apt-get download`, no root needed), is unpacked with `dpkg-deb -x`, and its
rrsync is used as shipped, only pointed at the rsync binary of the same package.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

RELEASES = ("3.2.7", "3.5.0")  # bookworm's release, and the security update its point releases ship


def unpack_rrsync(version: str, where: Path) -> str:
    """The rrsync of Debian 12's rsync `version` (e.g. "3.2.7"), running that package's own rsync."""
    where.mkdir(parents=True, exist_ok=True)
    versions = subprocess.run(["apt-cache", "madison", "rsync"], capture_output=True, text=True, check=False)
    wanted = [line.split("|")[1].strip() for line in versions.stdout.splitlines()
              if line.count("|") >= 2 and line.split("|")[1].strip().startswith((version + "-", version + "+"))]
    if not wanted:
        pytest.fail(f"apt knows no rsync {version} package (apt-cache madison rsync: {versions.stdout!r}); "
                    "this test needs Debian 12's package sources (bookworm and bookworm-security)")
    got = subprocess.run(["apt-get", "download", f"rsync={wanted[0]}"], cwd=where, capture_output=True, text=True,
                         check=False)
    debs = list(where.glob("rsync_*.deb"))
    assert got.returncode == 0 and debs, f"apt-get download rsync={wanted[0]} failed:\n{got.stderr}"
    root = where / "root"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(root)], check=True)
    rsync = root / "usr" / "bin" / "rsync"
    shown = subprocess.run([rsync, "--version"], capture_output=True, text=True, check=True).stdout
    assert f"version {version} " in shown, shown
    script = (root / "usr" / "bin" / "rrsync").read_text()
    assert "\nRSYNC = '/usr/bin/rsync'\n" in script
    rrsync = where / "rrsync"
    rrsync.write_text(script.replace("\nRSYNC = '/usr/bin/rsync'\n", f"\nRSYNC = '{rsync}'\n"))
    rrsync.chmod(0o755)
    return str(rrsync)
