"""How a failed rsync over ssh is told apart: by ssh's own exit status, learnt from ssh itself
(fdl/hostside/rsh_status.py).

rsync passes ssh's 255 on only when ssh is already gone as rsync exits; otherwise it exits 12, like a forced command
that refuses. The remote shell here is a stand-in for ssh, written to lose that race every time: it closes the
stream, then exits 255 only once rsync is gone (when its stdin, which rsync holds, reaches its end), ignoring the
SIGUSR1 rsync sends its remote shell then, as an ssh already on its way out does. Real rsync, no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fdl.errors import RemoteError
from fdl.publish.fetch import FetchError, materialize, pull_run
from fdl.publish.manifest import ManifestMissing
from fdl.publish.spec import parse_source_spec
from tests.conftest import IN_CI

LATE_SSH = """\
#!/bin/sh
# ssh refused: the stream closes at once, the status comes later (after rsync is gone)
trap '' USR1
exec >&-
echo "late-ssh: Permission denied (publickey)." >&2
cat >/dev/null
exit {status}
"""


@pytest.fixture
def rsync() -> str:
    found = shutil.which("rsync")
    if found is None:
        if IN_CI:
            pytest.fail("rsync is missing (scripts/apt-test.txt lists it)")
        pytest.skip("needs rsync")
    return found


def late_shell(tmp_path: Path, status: int) -> dict[str, str]:
    script = tmp_path / f"late-ssh-{status}"
    script.write_text(LATE_SSH.format(status=status))
    script.chmod(0o755)
    return dict(os.environ, RSYNC_RSH=str(script))


def test_rsync_itself_reports_the_late_ssh_as_a_stream_error(rsync, tmp_path):
    """The stand-in does what the race does: rsync alone exits 12, not ssh's 255."""
    done = subprocess.run([rsync, "-e", str(late_shell(tmp_path, 255)["RSYNC_RSH"]), "op@127.0.0.1:/srv/tree/",
                           str(tmp_path / "dest")], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 12, done.stderr


def test_a_refused_ssh_is_an_ssh_failure_whatever_rsync_exits(rsync, tmp_path):
    spec = parse_source_spec("rsync://op@127.0.0.1:/srv/tree")
    with pytest.raises(FetchError) as caught:
        materialize(spec, tmp_path / "tree", env=late_shell(tmp_path, 255))
    assert caught.value.message.startswith("fetching rsync://op@127.0.0.1:/srv/tree failed: ssh could not connect "
                                           "or log in:"), caught.value.message
    assert "late-ssh: Permission denied (publickey)." in caught.value.message
    assert "(--identity)" in (caught.value.hint or "")


def test_a_worker_whose_ssh_is_refused_re_dials_rather_than_finding_nothing_published(rsync, tmp_path):
    """regression: rsync's 12 for a refused key read as "the manifest is not there" (no run published yet)."""
    spec = parse_source_spec("rsync://op@127.0.0.1:/srv/flodl/run/tree")
    with pytest.raises(RemoteError, match="ssh could not connect or log in"):
        pull_run(spec, tmp_path / "worker", env=late_shell(tmp_path, 255))


def test_a_remote_shell_that_exits_otherwise_keeps_rsyncs_own_status(rsync, tmp_path):
    """A forced command that refuses (rrsync exits 1 behind ssh) is not an ssh failure: rsync's 12 stands."""
    spec = parse_source_spec("rsync://op@127.0.0.1:/srv/flodl/run/tree")
    env = late_shell(tmp_path, 1)
    with pytest.raises(FetchError, match="rsync exited 12"):
        materialize(spec, tmp_path / "tree", env=env)
    with pytest.raises(ManifestMissing, match="no run is published"):
        pull_run(spec, tmp_path / "worker", env=env)
