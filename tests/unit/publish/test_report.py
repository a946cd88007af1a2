"""The worker spellings `fdl publish` reports, each with the key it pairs with."""

from __future__ import annotations

from pathlib import Path

from fdl.hostside.farm.doors import key_line, rrsync_command
from fdl.publish.report import worker_sources


def test_the_rrsync_spelling_pairs_with_door_bs_own_command() -> None:
    """regression: the report told operators to install `command="rrsync -ro -munge <served>"`, which Debian 12's
    rsync 3.2.7 lets --copy-unsafe-links through; it now prints door b's guarded command."""
    rrsync, plain = worker_sources(Path("/home/op/.flodl/run"), "ctrl", "op")
    assert rrsync.source == "rsync://op@ctrl:/tree" and plain.source == "rsync://op@ctrl:/home/op/.flodl/run/tree"
    assert rrsync.authorized_keys_options == f'command="{rrsync_command("/home/op/.flodl/run")}",restrict'
    line = key_line("b", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOursOursOursOursOursOursOursOursOursOurs01", label="x",
                    controller_port=1337, served="/home/op/.flodl/run")
    assert f'command="{rrsync_command("/home/op/.flodl/run")}"' in line  # the same command join-config installs


def test_a_served_path_no_key_line_can_hold_gets_only_the_plain_spelling() -> None:
    (only,) = worker_sources(Path("/srv/my run"), "ctrl", None)
    assert only.key == "plain" and only.source == "rsync://ctrl:/srv/my run/tree"
