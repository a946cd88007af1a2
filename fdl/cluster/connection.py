"""How fdl's Ansible and its plain ssh connect: the shipped ansible.cfg's settings pinned, the private
ControlPath directory, and the environment every ansible-playbook fdl starts runs in.

- ansible-playbook is the one installed next to fdl (this environment's scripts directory goes first on
  PATH); the playbooks, roles and modules are the flodl.fdl collection fdl ships (ANSIBLE_COLLECTIONS_PATH
  points at it, fdl.resources), with its own module_utils only; the shipped ansible.cfg is the
  configuration, and the settings that matter are pinned in the environment so a stray ANSIBLE_* variable
  cannot undo them: pipelining on, facts off, host keys checked by ssh (`StrictHostKeyChecking=accept-new`:
  learn a new host once, refuse a changed key), persistent SSH masters under a short, stable control path
  so the next run reuses them.
- forks = the number of hosts; every host's interpreter comes from the inventory
  (`ansible_python_interpreter`), never from discovery.
- The ControlPath directory is private (0700, this user's, not a link) or refused: whoever can write there
  can sit in the middle of every multiplexed session. fdl.cluster.ssh builds a run's plain ssh from the same
  settings, so it rides the masters Ansible opened.
"""

from __future__ import annotations

import configparser
import os
import stat
import sys
import sysconfig
import tempfile
from pathlib import Path

from fdl.collection import RELATIVE
from fdl.errors import FdlError
from fdl.hostside.paths import cache_dir, runtime_dir
from fdl.resources import ansible_cfg, collections_path

_MAX_SOCKET_PATH = 104  # sun_path is 108 bytes; ssh appends ".XXXXXXXXXXXXXXXX" while it binds

# ansible.cfg key -> the environment variable that would override it (pinned from the shipped file)
_PINNED = {
    ("defaults", "gathering"): "ANSIBLE_GATHERING",
    ("defaults", "host_key_checking"): "ANSIBLE_HOST_KEY_CHECKING",
    ("defaults", "interpreter_python"): "ANSIBLE_PYTHON_INTERPRETER",
    ("defaults", "retry_files_enabled"): "ANSIBLE_RETRY_FILES_ENABLED",
    ("ssh_connection", "pipelining"): "ANSIBLE_PIPELINING",
    ("ssh_connection", "ssh_args"): "ANSIBLE_SSH_ARGS",
    ("ssh_connection", "control_path"): "ANSIBLE_SSH_CONTROL_PATH",
    ("ssh_connection", "timeout"): "ANSIBLE_TIMEOUT",
}


def ansible_bin_dir() -> Path:
    """The scripts directory of fdl's own environment, which must hold ansible-playbook."""
    scripts = Path(sysconfig.get_path("scripts"))
    if not (scripts / "ansible-playbook").exists():
        alt = Path(sys.executable).parent  # a venv's bin when sysconfig points elsewhere
        if (alt / "ansible-playbook").exists():
            return alt
        raise FdlError(
            f"ansible-playbook is not installed next to fdl (looked in {scripts}). fdl runs the Ansible that is "
            f"installed with it (ansible-core is one of its dependencies).",
            hint="reinstall fdl into this environment: pip install --force-reinstall fdl")
    return scripts


def _fits(directory: Path) -> bool:
    return len(str(directory)) + 1 + 40 + 17 <= _MAX_SOCKET_PATH


def control_path_dir() -> Path:
    """Where persistent SSH masters live: private, short and stable, so later runs find them.

    $XDG_RUNTIME_DIR/fdl-cp first (a per-user tmpfs the system made 0700),
    then ~/.cache/fdl/cp, then /tmp/fdl-cp-<uid> when both paths are too long
    for a socket. `ready_control_path_dir` checks it before use.
    """
    runtime = runtime_dir()
    if runtime is not None and _fits(runtime / "fdl-cp"):
        return runtime / "fdl-cp"
    preferred = cache_dir() / "cp"
    if _fits(preferred):
        return preferred
    return Path(tempfile.gettempdir()) / f"fdl-cp-{os.getuid()}"


def ready_control_path_dir() -> Path:
    """The ControlPath directory, created 0700 and checked: a real directory, owned by this user, private.

    Anyone who can write there can swap a master socket for their own and sit
    in the middle of every multiplexed ssh session Ansible and dispatch open,
    so a directory that fails any check is refused, never used or repaired.
    """
    directory = control_path_dir()
    try:
        directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise FdlError(f"cannot create the ssh ControlPath directory {directory}: {exc.strerror}.",
                       hint="Set XDG_RUNTIME_DIR or XDG_CACHE_HOME to a private directory of yours.") from None
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise FdlError(f"cannot inspect the ssh ControlPath directory {directory}: {exc.strerror}.") from None
    problems = []
    if stat.S_ISLNK(st.st_mode):
        problems.append("it is a symbolic link")
    elif not stat.S_ISDIR(st.st_mode):
        problems.append("it is not a directory")
    if st.st_uid != os.getuid():
        problems.append(f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
    if st.st_mode & 0o077:
        problems.append(f"its mode is {stat.S_IMODE(st.st_mode):04o}, not 0700")
    if problems:
        raise FdlError(
            f"the ssh ControlPath directory {directory} is not private: {'; '.join(problems)}. Whoever can write "
            f"there can take over the multiplexed ssh sessions fdl's Ansible and dispatch ride on, so fdl does "
            f"not use it.",
            hint=f"If it is yours, `rm -rf {directory}` and run again; if another user made it, ask an "
                 f"administrator to remove it, or set XDG_RUNTIME_DIR (or a shorter XDG_CACHE_HOME) so fdl uses "
                 f"a directory of your own.")
    return directory


def pinned_settings(cfg: Path) -> dict[str, str]:
    """The settings of `cfg` (the shipped ansible.cfg) that fdl pins, as the environment variables that would
    override them."""
    parser = configparser.RawConfigParser()
    parser.read(cfg)
    pinned = {}
    for (section, key), var in _PINNED.items():
        if parser.has_option(section, key):
            pinned[var] = parser.get(section, key)
    return pinned


def ansible_environment(forks: int) -> dict[str, str]:
    """Environment overrides for an ansible-playbook started by fdl."""
    cfg = ansible_cfg()
    cp_dir = ready_control_path_dir()
    collections = collections_path()
    env = pinned_settings(cfg)
    env.update({
        "ANSIBLE_CONFIG": str(cfg),
        # The flodl.fdl collection fdl ships (the wheel's, or a clone's built into the cache), and no other.
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        # The modules import their shared code from the collection (ansible_collections...module_utils); the
        # legacy module_utils search path holds the same directory and nothing else, whatever ~/.ansible has.
        "ANSIBLE_MODULE_UTILS": str(collections / RELATIVE / "plugins" / "module_utils"),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp_dir),
        "ANSIBLE_FORKS": str(forks),
        # fdl hands ansible-playbook a JSON inventory: every run would otherwise load the other inventory
        # plugins and parse their documentation for nothing.
        "ANSIBLE_INVENTORY_ENABLED": "yaml",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "PATH": os.pathsep.join([str(ansible_bin_dir()), os.environ.get("PATH", os.defpath)]),
    })
    return env
