"""rsync's remote shell, run so that fdl learns the shell's own exit status (fdl/publish/fetch.py runs it).

    python -I -m fdl.hostside.rsh_status FD COMMAND [ARGS...]   (as rsync's -e, with ssh and its options as COMMAND)

Why: rsync exits with ssh's status 255 (could not connect or log in) only when ssh is already gone by the time
rsync cleans up, and it checks that without waiting (rsync's cleanup.c: waitpid with WNOHANG). ssh that is refused
exits right after closing the connection, so rsync often reads the end of the stream first and exits 12 (protocol
data stream), the status a forced command that refuses a request also yields (measured here: about one refused key
in three, with rsync 3.5.0 and OpenSSH 9.2).

So this program runs COMMAND in ssh's place, hands it rsync's pipes (keeping no copy: the stream ends when COMMAND
closes it, as before), waits for it, and writes its exit status (decimal digits; -N for a signal N) to file
descriptor FD before it exits. fdl holds the other end of that pipe and reads to
its end, which comes only once this program is gone: what it reads is the remote shell's own status, or nothing.
COMMAND does not inherit FD. The signals rsync sends its remote shell (SIGUSR1 when it exits on an error) and the
usual termination signals are passed on to COMMAND, which exits as before; this program waits for it either way.

Standard library and its siblings only (it is host-side code: the signals go through supervisor.py, fdl's one
process sweep).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from .supervisor import signal_processes

PASSED_ON = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def main(argv: list[str]) -> int:
    # A program of its own (rsync's remote shell on the machine that runs fdl publish or fdl join): it prints,
    # exits and starts a process as a program does. It is shipped with the collection's module_utils, where
    # ansible-test's pylint wants module code to call exit_json and run_command instead, but no module runs it.
    # pylint: disable=ansible-bad-function
    if len(argv) < 3 or not argv[1].isdigit():
        print("usage: python -m fdl.hostside.rsh_status FD COMMAND [ARGS...]", file=sys.stderr)
        return 2
    status_fd, command = int(argv[1]), argv[2:]
    try:
        child = subprocess.Popen(command)  # close_fds: the command does not hold the status pipe
    except OSError as exc:
        print(f"fdl: cannot run the remote shell {command[0]}: {exc.strerror}", file=sys.stderr)
        code = 127
    else:
        for number in PASSED_ON:
            signal.signal(number, lambda received, _frame: signal_processes([child.pid], received))
        # The stream is COMMAND's alone from here: rsync sees its end when COMMAND closes it, as without this program.
        quiet = os.open(os.devnull, os.O_RDWR)
        os.dup2(quiet, 0)
        os.dup2(quiet, 1)
        os.close(quiet)
        code = child.wait()
    try:
        os.write(status_fd, str(code).encode())
    except OSError:  # nobody reads it any more (the rsync run was a success): nothing to report
        pass
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))  # pylint: disable=ansible-bad-function
