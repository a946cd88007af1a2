"""Keeping the run's token away from what `fdl join` starts: its ranks, builds, ssh tunnel and mounts.

Those run as the agent's own account, so the token must not sit where that account can read it. Once the
agent has its token (flag, FDL_JOIN_TOKEN or `join.token`), `seal()`:

1. removes FDL_JOIN_TOKEN from `os.environ`, so nothing the agent starts inherits it;
2. overwrites the variable's value in the process's initial environment block with NUL bytes. That block is
   what `/proc/PID/environ` shows for the process's whole life, whatever `os.environ` says later (unsetenv
   only drops libc's pointer to the string), so without this the token stayed readable there; the name
   stays, its value reads as empty;
3. marks the agent not dumpable (`prctl(PR_SET_DUMPABLE, 0)`, what ssh-agent and gpg-agent do): processes of
   the same account, ranks included, can then neither read `/proc/PID/environ` or `/proc/PID/mem` nor
   ptrace the agent. Root still can; programs the agent starts are dumpable again (execve resets it).

Linux only: elsewhere, and wherever the kernel refuses a step, `seal()` says what remains.
docs/controller.md ("What a rank can read") has the whole picture.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

from fdl.hostside.envvars import FDL_JOIN_TOKEN

PR_SET_DUMPABLE = 4  # <linux/prctl.h>
_ENV_START, _ENV_END = 50, 51  # fields of /proc/PID/stat (proc(5)), counted from 1


def seal(name: str = FDL_JOIN_TOKEN) -> list[str]:
    """Take `name` out of this process's environment and close the process to its own account; returns one
    sentence for each thing that could not be done (empty: all done, or nothing to do off Linux)."""
    remains = []
    os.environ.pop(name, None)
    if not sys.platform.startswith("linux"):
        return remains
    if not scrub_initial_environment(name):
        remains.append(f"the value of {name} stays readable in /proc/{os.getpid()}/environ")
    if not forbid_dumps():
        remains.append(f"processes of this account can read this agent's memory (/proc/{os.getpid()}/mem, "
                       f"ptrace), the token included")
    return remains


def _environment_block() -> tuple[int, int]:
    with open("/proc/self/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()  # field 3 (state) onwards: comm may hold spaces
    return int(fields[_ENV_START - 3]), int(fields[_ENV_END - 3])


def scrub_initial_environment(name: str) -> bool:
    """Overwrite the value of every `name=` entry in this process's initial environment block with NUL bytes.

    Each byte written is one read back first from the same place and found equal to what /proc/self/environ
    showed there, so nothing but that value is ever touched. True when /proc/self/environ no longer shows a
    value for `name` (also when it never held one)."""
    prefix = name.encode() + b"="
    try:
        with open("/proc/self/environ", "rb") as handle:
            block = handle.read()
        if not any(entry.startswith(prefix) and len(entry) > len(prefix) for entry in block.split(b"\0")):
            return True
        start, end = _environment_block()
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            offset = 0
            for entry in block.split(b"\0"):
                value = entry[len(prefix):]
                at = start + offset + len(prefix)
                if entry.startswith(prefix) and value and at + len(value) <= end:
                    mem.seek(at)
                    if mem.read(len(value)) == value:
                        mem.seek(at)
                        mem.write(b"\0" * len(value))
                offset += len(entry) + 1
        with open("/proc/self/environ", "rb") as handle:
            return not any(entry.startswith(prefix) and len(entry) > len(prefix)
                           for entry in handle.read().split(b"\0"))
    except (OSError, ValueError, IndexError):
        return False


def forbid_dumps() -> bool:
    """prctl(PR_SET_DUMPABLE, 0): no core dump, and no reading of this process by its own account but root."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
