"""Every directory fdl keeps something in, named once.

Standard library only, Python 3.8 compatible and importing nothing of fdl: code that runs on managed hosts
imports it too (relatively, as the collection's module_utils `paths`).

In a user's home (a worker's, the launching machine's, the publishing machine's), `~/.flodl`:

    ~/.flodl/libtorch/                 libtorch variants: `fdl libtorch download`, `fdl join --libtorch`,
                                       and the root `fdl nccl build` builds into on a worker
    ~/.flodl/join/                     `fdl join`'s stage: the source tree and rank logs (FDL_JOIN_STAGE moves it)
    ~/.flodl/launch/                   a launcher's layout on every host: supervisor.py, bin/, runs/
    ~/.flodl/launch/runs/RUN_ID/       one run: its token (0600, while the run lives), rank logs, final
                                       state.json, spec.json
    ~/.flodl/launch/live/              records of the launchers running now, when there is no private
                                       $XDG_RUNTIME_DIR (else $XDG_RUNTIME_DIR/fdl/)
    ~/.flodl/run/                      `fdl publish`'s served directory (tree -> releases/a|b), the
                                       default of `fdl publish --to` and of join-config's door b
    ~/.flodl/execution-node/venv/      on an execution node: the ansible-core and ansible-runner its jobs run
                                       with (the flodl.fdl.execution_node playbook makes it)

Per user, after the XDG base directory specification (a relative value is ignored, as the spec says):

    $XDG_CACHE_HOME/fdl/               (~/.cache/fdl) collections/ (the built collection tree), cp/ (ssh
                                       ControlPath sockets, when $XDG_RUNTIME_DIR is not private or too
                                       long), runner/ (ansible-runner)
    $XDG_STATE_HOME/fdl/               (~/.local/state/fdl) farms/: the farm credentials this user minted
    $XDG_CONFIG_HOME/fdl/              (~/.config/fdl) safe-directories: the directories whose files this user
                                       trusts though another account could write them (fdl.hostside.trust)
    $XDG_RUNTIME_DIR/                  used only when private (absolute, a directory, this user's, mode 0700):
                                       fdl/ (live-run records), fdl-cp/ (ControlPath sockets), fdl-tunnel-*/

On every host, the shared dataset root: /flodl/data (`data_path:`, `--data-path`, door a's served directory).

The roles' defaults that name these paths are kept equal to them by tests/unit/test_paths.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Mapping

#: fdl's directory in a home, and its parts (each a name under ~/.flodl)
FLODL = ".flodl"
LIBTORCH = "libtorch"
JOIN = "join"
LAUNCH = "launch"
RUNS = "runs"  # under launch/
LIVE = "live"  # under launch/
SERVED = "run"
EXECUTION_NODE = "execution-node"

#: the same, spelled from the home (`~/...`): what messages and help texts show, and the defaults a remote host
#: expands in its own home
FLODL_IN_HOME = "~/" + FLODL
LIBTORCH_IN_HOME = f"{FLODL_IN_HOME}/{LIBTORCH}"
JOIN_IN_HOME = f"{FLODL_IN_HOME}/{JOIN}"
LAUNCH_IN_HOME = f"{FLODL_IN_HOME}/{LAUNCH}"
RUNS_IN_HOME = f"{LAUNCH_IN_HOME}/{RUNS}"
SERVED_IN_HOME = f"{FLODL_IN_HOME}/{SERVED}"
NODE_VENV_IN_HOME = f"{FLODL_IN_HOME}/{EXECUTION_NODE}/venv"

#: the dataset root on every host when nothing names one
DEFAULT_DATA_PATH = "/flodl/data"

XDG_CACHE_HOME = "XDG_CACHE_HOME"
XDG_STATE_HOME = "XDG_STATE_HOME"
XDG_CONFIG_HOME = "XDG_CONFIG_HOME"
XDG_RUNTIME_DIR = "XDG_RUNTIME_DIR"


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def home(environ: Mapping[str, str] | None = None) -> str:
    """This user's home directory: $HOME, else the password database's."""
    return _environ(environ).get("HOME") or os.path.expanduser("~")


def flodl_dir(home_dir: str | os.PathLike[str]) -> Path:
    """~/.flodl of the home directory home_dir."""
    return Path(home_dir) / FLODL


def libtorch_root(home_dir: str | os.PathLike[str]) -> Path:
    """The user's libtorch root: ~/.flodl/libtorch."""
    return flodl_dir(home_dir) / LIBTORCH


def join_stage(environ: Mapping[str, str] | None = None) -> Path:
    """`fdl join`'s default stage: ~/.flodl/join."""
    return flodl_dir(home(environ)) / JOIN


def launch_runs(environ: Mapping[str, str] | None = None) -> Path:
    """Where a launcher keeps its runs on this machine: ~/.flodl/launch/runs."""
    return flodl_dir(home(environ)) / LAUNCH / RUNS


def launch_live(environ: Mapping[str, str] | None = None) -> Path:
    """Live-run records: $XDG_RUNTIME_DIR/fdl when that directory is private, else ~/.flodl/launch/live."""
    runtime = runtime_dir(environ)
    return runtime / "fdl" if runtime is not None else flodl_dir(home(environ)) / LAUNCH / LIVE


def served(environ: Mapping[str, str] | None = None) -> Path:
    """`fdl publish`'s default served directory: ~/.flodl/run."""
    return flodl_dir(home(environ)) / SERVED


def _xdg(name: str, fallback: tuple[str, ...], environ: Mapping[str, str] | None) -> Path:
    value = _environ(environ).get(name) or ""
    base = Path(value) if os.path.isabs(value) else Path(home(environ)).joinpath(*fallback)
    return base / "fdl"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """fdl's cache directory: $XDG_CACHE_HOME/fdl, else ~/.cache/fdl."""
    return _xdg(XDG_CACHE_HOME, (".cache",), environ)


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """fdl's state directory: $XDG_STATE_HOME/fdl, else ~/.local/state/fdl."""
    return _xdg(XDG_STATE_HOME, (".local", "state"), environ)


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """fdl's configuration directory: $XDG_CONFIG_HOME/fdl, else ~/.config/fdl."""
    return _xdg(XDG_CONFIG_HOME, (".config",), environ)


def runtime_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """$XDG_RUNTIME_DIR when it is what the specification promises (absolute, a directory, this user's, mode
    0700), else None: whoever else can write there could swap what fdl keeps in it."""
    value = (_environ(environ).get(XDG_RUNTIME_DIR) or "").strip()
    if not value or not os.path.isabs(value):
        return None
    try:
        info = os.lstat(value)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return Path(value)
