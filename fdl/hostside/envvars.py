"""Every FDL_* environment variable, once: its name, what it means, what kind it is and which modules use it.

fdl's code takes the names from here (`envvars.FDL_PORT`, never the string spelled again) and reads a value
with `read()`; docs/cli.md's table of variables is generated from REGISTRY (scripts/env-variables), and
tests/unit/test_envvars.py keeps the three in step: no FDL_ name spelled as a string anywhere else in fdl/,
every name the repository mentions registered here, and each entry's modules exactly those that use it.

The kinds:

    setting      a user sets it to change what fdl does
    test hook    read by fdl's own code, but there for the test suite (a user has no reason to set it)
    given        fdl sets it for a program it starts (a rank, a build recipe, the signature probe, git)
    test suite   read by the test suite, the fake NVML or the benchmarks only, never by fdl

Standard library only, Python 3.8 compatible and importing nothing of fdl but its sibling fdl/hostside/paths.py: code
that runs on managed hosts reads its variables through it too (relatively, as the collection's module_utils
`envvars`).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple

from .paths import DEFAULT_DATA_PATH, JOIN_IN_HOME

SETTING = "setting"
HOOK = "test hook"
GIVEN = "given"
SUITE = "test suite"
KINDS = (SETTING, HOOK, GIVEN, SUITE)


class Variable(NamedTuple):
    name: str
    kind: str
    meaning: str
    modules: tuple[str, ...]  # fdl/ modules that read it (set it, for `given`); the suite's files for `test suite`


REGISTRY: dict[str, Variable] = {}


def _register(name: str, kind: str, modules: tuple[str, ...], meaning: str) -> str:
    REGISTRY[name] = Variable(name, kind, meaning, modules)
    return name


def read(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of the registered variable `name` in environ (default os.environ), as it is; "" when unset."""
    if name not in REGISTRY:
        raise KeyError(f"{name} is not a registered fdl variable (fdl/hostside/envvars.py)")
    return (os.environ if environ is None else environ).get(name) or ""


# --------------------------------------------------------------------------- settings

FDL_ENV = _register(
    "FDL_ENV", SETTING, ("fdl/config/project.py", "fdl/cli/context.py", "fdl/cli/probe.py"),
    "The env overlay to select (fdl.NAME.yml) when neither `@NAME` nor `--env` is given.")
FDL_DEBUG = _register(
    "FDL_DEBUG", SETTING, ("fdl/cli/main.py",),
    "`1`: what `--debug` does (a traceback on an error).")
FDL_PORT = _register(
    "FDL_PORT", SETTING, ("fdl/launch/plan.py",),
    "The controller's port for a launcher run, under `--port` and over the configuration's.")
FDL_JOIN_TOKEN = _register(
    "FDL_JOIN_TOKEN", SETTING, ("fdl/config/join_fields.py", "fdl/cli/_controller.py", "fdl/agent/secrecy.py"),
    "The run's token, for `fdl join`, `fdl start` and `fdl status` (never on a command line: argv is public). "
    "Removed from every rank's environment; `fdl join` takes it out of its own once read.")
#: Secrets a rank never inherits from the process that starts it (the agent, the launcher), nor a build recipe.
SECRET_ENV_NAMES = (FDL_JOIN_TOKEN,)


def without_secrets(env: Mapping[str, Any]) -> dict[str, Any]:
    """env without the variables that hold the join token."""
    return {k: v for k, v in env.items() if k not in SECRET_ENV_NAMES}


FDL_SSH_COMMAND = _register(
    "FDL_SSH_COMMAND", SETTING, ("fdl/agent/tunnel.py",),
    "The command `fdl join` runs in place of plain `ssh` for its tunnel and for sshfs (e.g. "
    "`ssh -F /etc/fdl/ssh_config`), split like a shell would.")
FDL_JOIN_STAGE = _register(
    "FDL_JOIN_STAGE", SETTING, ("fdl/agent/prepare.py",),
    f"Where `fdl join` keeps its source tree and rank logs (default {JOIN_IN_HOME}).")
FDL_JOIN_BACKOFF_BASE_S = _register(
    "FDL_JOIN_BACKOFF_BASE_S", SETTING, ("fdl/agent/backoff.py",),
    "`fdl join --persist`: the first wait between dials, in seconds (default 2). The tests shorten it.")
FDL_JOIN_BACKOFF_MAX_S = _register(
    "FDL_JOIN_BACKOFF_MAX_S", SETTING, ("fdl/agent/backoff.py",),
    "`fdl join --persist`: the longest wait between dials, in seconds (default 60). The tests shorten it.")
FDL_SIGNATURE_TIMEOUT_S = _register(
    "FDL_SIGNATURE_TIMEOUT_S", SETTING, ("fdl/agent/signature.py",),
    "How long `fdl join` waits for the training binary's signature probe, in seconds (default 120).")
FDL_LIBTORCH_MIRROR = _register(
    "FDL_LIBTORCH_MIRROR", SETTING, ("fdl/libtorch/source.py",),
    "Base URL of a libtorch mirror for downloads, under `--mirror` and over the configuration's `mirror:`.")
FDL_SAFE_DIRECTORIES = _register(
    "FDL_SAFE_DIRECTORIES", SETTING, ("fdl/hostside/trust.py",),
    "Directories (separated by `:`; `DIR/*` covers everything below DIR) whose fdl.yml, overlays, `.fdl/` and "
    "project `libtorch/` are to be believed though another account owns them or can write them; added to the "
    "list in `~/.config/fdl/safe-directories` (docs/config.md, \"Whose files fdl reads\").")
FDL_LIBTORCH_FROM_PYTORCH = _register(
    "FDL_LIBTORCH_FROM_PYTORCH", SETTING, ("fdl/hostside/libtorch/resolve.py",),
    "`0`: this Python environment's PyTorch is not a libtorch of last resort (the tests set it).")

# --------------------------------------------------------------------------- test hooks

FDL_PROBE_ROOT = _register(
    "FDL_PROBE_ROOT", HOOK, ("fdl/hostside/checks/probe.py",),
    "The file system root the probe's stack checks read /proc/modules and /dev under (default /): the tests "
    "point it at scripted hosts (nouveau loaded, device nodes missing).")

# --------------------------------------------------------------------------- given to what fdl starts

FDL_RUN_ID = _register(
    "FDL_RUN_ID", GIVEN,
    ("fdl/controller/world.py", "fdl/controller/protocol.py", "fdl/launch/dispatch.py", "fdl/hostside/reap.py"),
    "Ranks: the run's id. The playbooks export it to everything they start, so a canceled run's leftovers are "
    "found by it (the fdl_reap role).")
FDL_CONTROLLER = _register(
    "FDL_CONTROLLER", GIVEN, ("fdl/controller/world.py", "fdl/controller/protocol.py"),
    "Ranks: the controller's address, host:port, as ranks should dial it.")
FDL_DATA_PATH = _register(
    "FDL_DATA_PATH", GIVEN, ("fdl/controller/world.py", "fdl/controller/protocol.py", "fdl/agent/prepare.py"),
    f"Ranks: the dataset root on this host (default {DEFAULT_DATA_PATH}).")
FDL_HOST = _register(
    "FDL_HOST", GIVEN, ("fdl/controller/world.py", "fdl/controller/protocol.py", "fdl/hostside/collective/ranks.py",
                        "fdl/hostside/collective/allreduce.py"),
    "Ranks: this host's name in the roster.")
FDL_NODE_RANK = _register(
    "FDL_NODE_RANK", GIVEN, ("fdl/controller/world.py", "fdl/controller/protocol.py"),
    "Ranks: this host's index among the hosts.")
FDL_NUM_NODES = _register(
    "FDL_NUM_NODES", GIVEN, ("fdl/controller/world.py", "fdl/controller/protocol.py"),
    "Ranks: the number of hosts.")
FDL_BACKEND = _register(
    "FDL_BACKEND", GIVEN, ("fdl/controller/world.py", "fdl/controller/protocol.py",
                           "fdl/hostside/collective/ranks.py", "fdl/hostside/collective/allreduce.py"),
    "Ranks: `nccl` when every host offers GPUs, else `gloo`.")
FDL_DEVICE = _register(
    "FDL_DEVICE", GIVEN, ("fdl/controller/world.py", "fdl/controller/protocol.py"),
    "Ranks: `cuda:ID` or `cpu`.")
FDL_GPU_RAM_SHARE = _register(
    "FDL_GPU_RAM_SHARE", GIVEN, ("fdl/controller/world.py", "fdl/controller/protocol.py", "fdl/agent/prepare.py"),
    "Ranks: APU boxes, the share of host RAM the integrated GPU may use, when `fdl join --gpu-ram-share` "
    "gave one.")
FDL_GPU_FEATURE = _register(
    "FDL_GPU_FEATURE", GIVEN, ("fdl/libtorch/gate.py", "fdl/agent/prepare.py", "fdl/launch/build.py"),
    "Build recipes: `cuda` or `rocm` for the libtorch variant's GPU vendor, empty for CPU "
    "(`cargo build --features \"$FDL_GPU_FEATURE\"`).")
FDL_SIGNATURE_PROBE = _register(
    "FDL_SIGNATURE_PROBE", GIVEN, ("fdl/agent/signature.py",),
    "`1` for the training binary's signature probe: print `fdl-signature: HEX` and exit, touching no GPU.")
FDL_GIT_USERNAME = _register(
    "FDL_GIT_USERNAME", GIVEN, ("fdl/publish/fetch.py",),
    "git, for one fetch: the user name a source URL carried, answered by fdl's credential helper.")
FDL_GIT_PASSWORD = _register(
    "FDL_GIT_PASSWORD", GIVEN, ("fdl/publish/fetch.py",),
    "git, for one fetch: the password a source URL carried, answered by fdl's credential helper.")

# --------------------------------------------------------------------------- the test suite's own

_register("FDL_FAKE_NVML", SUITE, ("tests/fakes/fake_nvml.c",),
          "The fake libnvidia-ml's devices, e.g. `H100:9.0:80G,RTX3060:8.6:12G` (unset: none).")
_register("FDL_FAKE_NVML_DRIVER", SUITE, ("tests/fakes/fake_nvml.c",),
          "The fake libnvidia-ml's driver version.")
_register("FDL_FAKE_NVML_CUDA", SUITE, ("tests/fakes/fake_nvml.c",),
          "The fake libnvidia-ml's CUDA driver version, as NVML encodes it (12080).")
_register("FDL_TESTBED_PREFIX", SUITE, ("tests/testbed/bed.py",),
          "The prefix of the testbed's namespaces, bridge and users, so that testbeds can run side by side.")
_register("FDL_TESTBED_NET", SUITE, ("tests/testbed/bed.py",),
          "The testbed's /24, as its first three numbers (10.231.0).")
_register("FDL_TESTBED_INNER_NET", SUITE, ("tests/testbed/bed.py",),
          "The /24 of the testbed's hosts behind its execution nodes, which this machine has no route to (10.232.0).")
_register("FDL_MATRIX", SUITE, ("tests/platforms.py",),
          "`all`: every Python and ansible-core combination of the platform matrix (scripts/test.sh --matrix).")
_register("FDL_MATRIX_CACHE", SUITE, ("tests/platforms.py",),
          "Where the platform matrix keeps its virtual environments (default ~/.cache/fdl-test/matrix).")
_register("FDL_TEST_PYTHON_<M>_<N>", SUITE, ("tests/platforms.py",),
          "The interpreter for Python M.N in the platform matrix (FDL_TEST_PYTHON_3_12).")
_register("FDL_TEST_CACHE", SUITE, ("tests/integration/test_collection.py", "tests/integration/images/nspawn.py"),
          "Where the collection checks and the systemd images keep what they build once.")
_register("FDL_TEST_REAL_HOME", SUITE, ("tests/conftest.py",),
          "The home of whoever runs the tests (the suite runs in a home of its own).")
_register("FDL_TEST_REAL_CACHE", SUITE, ("tests/conftest.py",),
          "The cache directory of whoever runs the tests.")
_register("FDL_TEST_COLLECTIONS", SUITE, ("tests/unit/cluster/test_inventory_plugin.py",),
          "The collections path the inventory plugin's tests built.")
_register("FDL_TEST_LOG", SUITE, ("tests/cli/test_publish.py",),
          "The file a test's build recipe writes its environment to.")
_register("FDL_CRASH_SEED", SUITE, ("tests/integration/test_publish_crash.py",),
          "Replays one run of the publish crash test.")
_register("FDL_MOLECULE_INVENTORY", SUITE, ("molecule/no-host.yml",),
          "The inventory the molecule scenarios converge on.")
_register("FDL_BENCH_TOKEN", SUITE, ("bench/controller.py",),
          "The token of the benchmark's controller (kept off its command line).")
