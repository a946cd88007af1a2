"""Every `fdl join` setting, declared once: the `join:` block's record, with what each field means.

`JoinDefaults` is the `join:` block of fdl.yml as the schema checked it, and
each of its fields carries a `Setting`: the help text, the command-line
flag's metavar (or none: a field only the block sets), how the block's value
is checked, the environment variable the flag also reads, and whether the
value is a secret. Everything else is derived from this one class: the
schema's known keys and its check of the block (fdl.config.schema), the
`fdl join` options (fdl/cli/join.py builds them from `cli_settings()`), the
agent's merge of flags over the block (fdl.agent.options), and the
fdl_join_worker role's variables are checked against it by a test.

No `from __future__ import annotations` here: the `Annotated` metadata must be
a real object in `JoinDefaults.__annotations__`, read without evaluating text.
"""

from typing import Annotated, NamedTuple

from ..hostside.checks.devices import Devices
from ..hostside.envvars import FDL_GPU_FEATURE, FDL_JOIN_TOKEN, FDL_LIBTORCH_MIRROR
from ..hostside.libtorch.variants import CHOICES as LIBTORCH_CHOICES
from ..hostside.paths import DEFAULT_DATA_PATH, LIBTORCH_IN_HOME


class Setting(NamedTuple):
    """What one join field means, beyond its name, type and default."""

    help: str
    metavar: str | None = None  # the flag's metavar; None with cli=False
    check: str = "text"  # how the join: block's value is checked: text, host, address, devices, bool, fraction, args,
    # path (a file: ~ expanded, relative to the file that sets it)
    cli: bool = True  # a `fdl join` flag (--name-with-dashes); False: only the join: block sets it
    off: str | None = None  # a bool flag's negative form (--no-persist)
    envvar: str | None = None  # the flag also reads this variable
    secret: bool = False  # never shown, logged or put on a command line


class JoinDefaults(NamedTuple):
    """The join: block: defaults for every `fdl join` flag (the JoinArgs fields), checked and typed."""

    controller: Annotated[str | None, Setting(
        "Controller address. With --ssh, as seen FROM the ssh host (default 127.0.0.1:1337).",
        "HOST[:PORT]", check="address")] = None
    ssh: Annotated[str | None, Setting(
        "Reach the controller through this sshd: an ssh -L forward of its port, torn down on exit.",
        "[USER@]HOST[:PORT]")] = None
    identity: Annotated[str | None, Setting(
        "Private key for the tunnel (ssh -i); also used by sshfs and rsync.", "KEY")] = None
    known_hosts: Annotated[str | None, Setting(
        "A known_hosts file holding the door's host key: ssh, sshfs and rsync check the door against it alone "
        "(StrictHostKeyChecking=yes, no first-use trust).", "FILE", check="path")] = None
    token: Annotated[str | None, Setting(
        f"The run's pre-shared token (controller.join.token). Prefer {FDL_JOIN_TOKEN} or --token-file: argv is "
        "public.", "HEX", envvar=FDL_JOIN_TOKEN, secret=True)] = None
    token_file: Annotated[str | None, Setting(
        "A file holding the run's token, yours or root's and 0600 (exclusive with --token).", "FILE",
        check="path")] = None
    bin: Annotated[str | None, Setting(
        "Training binary on this box (exclusive with --source).", "PATH")] = None
    source: Annotated[str | None, Setting(
        "Fetch and build here: file:///abs, rsync://[user@]host[:port]:/abs or git+https://host/o/r#ref.",
        "SPEC")] = None
    source_cwd: Annotated[str | None, Setting(
        "Project directory inside the fetched tree (default: its root).", "DIR")] = None
    source_build: Annotated[str | None, Setting(
        f"Build recipe, a shell line (default: cargo build --release); gets LIBTORCH_PATH, {FDL_GPU_FEATURE}, "
        "LD_LIBRARY_PATH.", "RECIPE")] = None
    source_bin: Annotated[str | None, Setting(
        "Built artifact relative to the project dir, e.g. target/release/train.", "PATH")] = None
    libtorch: Annotated[str | None, Setting(
        f"Acquire libtorch into {LIBTORCH_IN_HOME} first: {', '.join(LIBTORCH_CHOICES)} "
        "(default: whatever is active here).", "VARIANT")] = None
    host: Annotated[str | None, Setting(
        "Name in the roster (default: this machine's hostname).", "NAME", check="host")] = None
    devices: Annotated[Devices | None, Setting(
        "GPU ids to offer, e.g. 0,1 (default: all); cpu:N for N CPU ranks.", "IDS", check="devices")] = None
    persist: Annotated[bool, Setting(
        "Keep re-dialing across runs with backoff; stop only on exit 2.", check="bool",
        off="--no-persist")] = False
    data_path: Annotated[str | None, Setting(
        f"Dataset root on this box, shipped to the ranks (default {DEFAULT_DATA_PATH} when --data-source is set).",
        "DIR")] = None
    data_source: Annotated[str | None, Setting(
        "Mount the dataset root read-only from there when it is not already in place.",
        "sshfs://USER@HOST:/PATH")] = None
    gpu_ram_share: Annotated[float | None, Setting(
        "APU boxes: the share of host RAM the integrated GPU may use, e.g. 0.5; shipped to the ranks.",
        "FRACTION", check="fraction")] = None
    no_sig_probe: Annotated[bool, Setting(
        "Skip the pre-dial model-signature probe.", check="bool", off="--sig-probe")] = False
    args: Annotated[tuple[str, ...] | None, Setting(
        "Arguments for the training binary (a -- tail on the command line wins).", check="args",
        cli=False)] = None
    libtorch_mirror: Annotated[str | None, Setting(
        f"Base URL of a libtorch mirror ({FDL_LIBTORCH_MIRROR} and the libtorch: block's mirror: win).",
        cli=False)] = None


def _declared() -> tuple[tuple[str, Setting], ...]:
    out = []
    for name in JoinDefaults._fields:
        metadata = getattr(JoinDefaults.__annotations__[name], "__metadata__", ())
        setting = next((m for m in metadata if isinstance(m, Setting)), None)
        if setting is None:
            raise TypeError(f"JoinDefaults.{name} declares no Setting")
        out.append((name, setting))
    return tuple(out)


#: (name, Setting) for every join field, in declaration order.
SETTINGS = _declared()
#: The keys the join: block knows.
JOIN_KEYS: tuple[str, ...] = JoinDefaults._fields
#: The fields `fdl join` takes as flags (the JoinArgs fields), in declaration order.
CLI_FIELDS = tuple(name for name, setting in SETTINGS if setting.cli)


def flag_of(name: str) -> str:
    """The command-line flag of a join field: --source-cwd for source_cwd."""
    return "--" + name.replace("_", "-")


def flag_type(setting: Setting) -> type:
    """The type a flag's value arrives as on the command line (devices: text, parsed by the agent's options)."""
    return {"bool": bool, "fraction": float}.get(setting.check, str)
