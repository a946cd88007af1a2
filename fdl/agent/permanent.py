"""The closed list of permanent failures of `fdl join`: exit 2, which the worker unit answers with poweroff.

Permanent means that re-dialing cannot mend it and that this box alone can
tell. Everything here is decided from the worker's own configuration and its
own disk, once, before the first dial (`read_options` for the configuration
itself, then `check`). The list, and nothing else:

1. the configuration does not parse: fdl.yml (its join: block), the options
   (fdl.agent.options raises UsageError, exit 2 like every command line that
   does not parse), the --source spec, a --source-cwd or --source-bin that
   leaves the tree;
2. no GPU when GPUs are asked for: the GPU stack check fails, --devices names
   ids this box lacks, or --libtorch cannot serve what it offers (`auto` over
   GPUs no single build serves, a variant the configured source does not
   publish);
3. a binary or toolchain this box's own configuration names and lacks: --bin
   (missing or not executable), the ssh client for --ssh, sshfs for
   --data-source, the fetch tool of --source's scheme (rsync, git, ssh), the
   command a --source-build given here starts with, a --libtorch variant
   pinned by sha256 that is installed from other bytes;
4. an identity file (--identity) that is missing or unreadable;
5. a known_hosts file its own join.known_hosts names that this account
   cannot read, or no known_hosts entry for the --ssh door while ssh checks
   host keys strictly (this box's files alone, through `ssh -G` and
   `ssh-keygen -F`; what the door presents is never asked);
6. a stage this user cannot write because of its own permissions or a
   read-only file system: EROFS, or EACCES/EPERM from a directory this user
   or root owns. The stage is the join stage (its logs and source
   directories), the libtorch root when --libtorch acquires a variant, the
   working directory of a --bin run, and the --data-source mount point.
   Never ENOSPC, EDQUOT or EIO (another account or the job itself fills a
   disk, a mount goes stale), and never a directory another account owns
   (it could have been planted).

After `check`, nothing is permanent (fdl.agent.agent): the network, disks
and mounts, whatever a fetched or published tree says (its bin, cwd,
recipe, modes), the build of fetched source, a GPU or a binary that goes
away later. Those fail one attempt with exit 1, and `--persist` re-dials
with backoff. This is the one module of fdl that raises a permanent error
(tests/unit/test_permanence.py holds the package to it).
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fdl.agent.options import JoinOptions, resolve_options
from fdl.errors import ConfigError, ExitCode, FdlError, PermanentError
from fdl.hostside.envvars import FDL_JOIN_STAGE

if TYPE_CHECKING:
    from fdl.config.project import Config
    from fdl.offer import Offer

Note = Callable[[str], None]
#: A write these refuse is the box's own provisioning (a read-only file system; its own or root's modes).
OWN_REFUSALS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_SHELL_SYNTAX = set("$`;&|<>(){}*?[]~!\\\"'")


def read_options(load: Callable[[], Config], flags: dict[str, Any], tail: list[str] | None) -> JoinOptions:
    """The worker's configuration as options; a configuration that does not parse is permanent."""
    try:
        config = load()
    except ConfigError as exc:  # a worker's fdl.yml that does not parse will not parse on the next dial either
        raise ConfigError(exc.message, hint=exc.hint, errors=exc.errors, warnings=exc.warnings,
                          exit_code=ExitCode.PERMANENT) from None
    return resolve_options(config.join, flags, tail, libtorch_block=config.libtorch)


def check(options: JoinOptions, *, environ: Mapping[str, str] | None = None, note: Note = lambda _: None) -> None:
    """Run the whole list; raises PermanentError on the first entry that holds."""
    env = os.environ if environ is None else environ
    _source(options, env)
    offer = _offer(options, env)
    _tools(options, env)
    if options.identity:
        check_identity(options.identity)
    if options.known_hosts:
        check_known_hosts(options.known_hosts)
    if options.ssh is not None:
        _door(options, env)
    _libtorch(options, offer, env)
    _stage(options, env)
    note("checked: this box's own configuration holds (anything that fails from here on is transient)")


# ---------------------------------------------------------------------------------------------- the entries

def _source(options: JoinOptions, env: Mapping[str, str]) -> None:
    if options.source is None:
        return
    from fdl.publish.fetch import FetchError, check_tools
    from fdl.publish.manifest import check_tree_path
    from fdl.publish.spec import SourceSpecError, parse_source_spec

    try:
        spec = parse_source_spec(options.source)
    except SourceSpecError as exc:
        raise PermanentError(exc.message, hint=exc.hint) from None
    try:
        project = check_tree_path(options.source_cwd, "--source-cwd") if options.source_cwd else "."
        if options.source_bin is not None:
            check_tree_path(options.source_bin, "--source-bin", base=project)
    except ValueError as exc:
        raise PermanentError(f"{exc}.", hint="Both are paths inside the fetched tree.") from None
    try:
        check_tools(spec)
    except FetchError as exc:  # a missing rsync, git or ssh: re-dialing cannot install it
        raise PermanentError(exc.message, hint=exc.hint) from None
    if options.source_build is not None:
        _recipe_command(options.source_build, env)


def _recipe_command(recipe: str, env: Mapping[str, str]) -> None:
    """The command a --source-build given on this box starts with must exist here (`command -v`, as the
    recipe's /bin/sh finds it). Whatever the shell or the fetched tree decides (a variable, a relative path,
    shell syntax) is left to the build, where a failure is transient."""
    try:
        words = shlex.split(recipe)
    except ValueError:
        return
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        words.pop(0)  # VAR=value assignments before the command
    if not words or _SHELL_SYNTAX & set(words[0]) or ("/" in words[0] and not words[0].startswith("/")):
        return
    try:
        found = subprocess.run(["/bin/sh", "-c", 'command -v "$1"', "sh", words[0]], env=dict(env),
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return
    if found.returncode != 0:
        raise PermanentError(
            f"the build recipe `{recipe}` (--source-build, this box's own configuration) starts with "
            f"{words[0]!r}, which is not installed here (not on PATH): the build toolchain is missing.",
            hint="Install the toolchain in this user's PATH (for cargo: rustup, https://rustup.rs), or change "
                 "--source-build.")


def _offer(options: JoinOptions, env: Mapping[str, str]) -> Offer:
    from fdl.offer import check_gpu_stack

    try:
        return check_gpu_stack(options.devices, env)
    except FdlError as exc:
        raise PermanentError(exc.message, hint=exc.hint) from None


def _tools(options: JoinOptions, env: Mapping[str, str]) -> None:
    if options.bin is not None:
        binary = os.path.abspath(options.bin)
        if not os.path.isfile(binary):
            raise PermanentError(f"the training binary {options.bin} is not on this box ({binary}).",
                                 hint="--bin is a path on this box; to build it here instead, use --source.")
        if not os.access(binary, os.X_OK):
            raise PermanentError(f"the training binary {binary} is not executable.", hint=f"chmod +x {binary}")
    if options.ssh is not None:
        from fdl.agent.tunnel import ssh_words

        if shutil.which(ssh_words(env)[0], path=env.get("PATH")) is None:
            raise PermanentError("--ssh needs the OpenSSH client (ssh), which is not installed on this box.",
                                 hint="Install it (Debian/Ubuntu: apt-get install openssh-client).")
    if options.data_source is not None and shutil.which("sshfs", path=env.get("PATH")) is None:
        raise PermanentError("--data-source sshfs:// needs sshfs, which is not installed on this box.",
                             hint="Install it (Debian/Ubuntu: apt-get install sshfs), or provision the data another "
                                  "way and name it with --data-path alone.")


def check_identity(identity: str) -> None:
    """An identity file that is missing or unreadable (it serves the ssh door, sshfs, rsync and git over ssh)."""
    if not os.path.isfile(identity):
        raise PermanentError(f"--identity {identity}: no such key file on this box.",
                             hint="Point --identity at the private key the controller's sshd accepts.")
    try:
        with open(identity, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise PermanentError(f"--identity {identity}: this account cannot read it ({exc.strerror or exc}).",
                             hint="The key must be readable by the account fdl join runs as (and by nobody "
                                  "else: chmod 600).") from None


def check_known_hosts(path: str) -> None:
    """The known_hosts file this box's own configuration pins the door with (join.known_hosts) must be there
    and readable: without it ssh can never accept the door."""
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise PermanentError(f"join.known_hosts {path}: this account cannot read it ({exc.strerror or exc}), so "
                             f"ssh could never accept the door's host key.",
                             hint="Put the door's host key there (fdl join-config writes it as .fdl/LABEL/"
                                  "known_hosts, and its cloud-init user-data installs it).") from None


def _door(options: JoinOptions, env: Mapping[str, str]) -> None:
    from fdl.agent.tunnel import Tunnel

    assert options.ssh is not None
    known = Tunnel(options.ssh, options.controller, identity=options.identity, environ=env).door_keys()
    if known is not None and not known.keys:
        raise PermanentError(
            f"this box's known_hosts ({', '.join(known.files) or '(none)'}) holds no host key for the door "
            f"{known.name}, and ssh refuses an unknown host under BatchMode: it can never accept the door.",
            hint="Put the door's real host key into this box's known_hosts (ssh-keyscan it over a path you trust, "
                 "or copy it from the door's /etc/ssh/*.pub; fdl join-config's worker files carry it).")


def _libtorch(options: JoinOptions, offer: Offer, env: Mapping[str, str]) -> None:
    if options.libtorch is None:
        return
    from fdl.libtorch.install import check_installed_pin
    from fdl.libtorch.source import check_served, route_auto

    try:
        variant = route_auto(offer.vendor, offer.capabilities) if options.libtorch == "auto" else options.libtorch
        check_served(variant, options.libtorch_source)
        check_installed_pin(variant, options.libtorch_source, env)
    except FdlError as exc:
        raise PermanentError(exc.message, hint=exc.hint) from None


def _stage(options: JoinOptions, env: Mapping[str, str]) -> None:
    from fdl.agent.data import write_probe
    from fdl.agent.prepare import stage_root

    stage = stage_root(env)
    directories = [stage, stage / "logs"] + ([stage / "source"] if options.source is not None else [])
    if options.libtorch is not None:
        from fdl.hostside.libtorch.resolve import home_of, home_root

        directories.append(home_root(home_of(env)))
    if options.bin is not None:
        directories.append(Path.cwd())  # ranks write their outputs relative to it
    for directory in directories:
        failed = write_probe(directory)
        if failed is not None and own_refusal(directory, failed):
            raise _unwritable(directory, failed, "the stage directory")
    if options.data_source is not None:
        mountpoint = Path(options.data_root or "")
        try:
            os.lstat(mountpoint)
        except FileNotFoundError:
            try:
                os.makedirs(mountpoint, exist_ok=True)
            except OSError as exc:
                if own_refusal(mountpoint, exc):
                    raise _unwritable(mountpoint, exc, "the --data-path mount point") from None
        except OSError:
            pass  # there, but not answering: a stale mount, which the data step remounts


def own_refusal(path: Path, exc: OSError) -> bool:
    """Whether a write refused at path is this box's own provisioning: a read-only file system, or the modes of
    a directory this user or root owns. Another account's directory in the way is never permanent."""
    if exc.errno == errno.EROFS:
        return True
    if exc.errno not in OWN_REFUSALS:
        return False
    for place in (Path(path), *Path(path).parents):
        try:
            owner = os.stat(place).st_uid
        except OSError:
            continue  # not there yet, or not searchable: the refusal comes from higher up
        return owner in (os.getuid(), 0)
    return False


def _unwritable(path: Path, exc: OSError, what: str) -> PermanentError:
    name = errno.errorcode.get(exc.errno or 0, "?")
    return PermanentError(
        f"{what} {path} is not writable by this user: {exc.strerror or exc} ({name}), by this box's own "
        f"permissions or a read-only file system.",
        hint=f"fdl join writes its source tree, build output, rank logs, libtorch and data mount there: give this "
             f"user a writable home (or point {FDL_JOIN_STAGE} or --data-path elsewhere), or fix the directory's "
             f"owner, modes or mount.")
