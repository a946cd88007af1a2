"""Wall time of `fdl join-config`, measured in one run.

    python bench/join_config.py [--runs N] [--baseline DIR]

Prints the median wall and CPU time (user + system, children included) of a
scripted first run (`fdl join-config b300 --controller op@127.0.0.1:PORT
--cloud-init --yes`, on a project whose farm directory and overlay are removed
before each sample, so every sample mints) and of a re-run (credentials
reused), door b, against a private sshd configuration and host key in a temp
directory; no sshd listens. A bare `python3 -c pass` is timed in the same
rounds for scale.

With --baseline DIR (another checkout of fdl, e.g. `git archive main | tar -x
-C DIR`) the same commands of that tree run in the same interleaved rounds, so
a change is measured before and after against the same noise.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import PY, compile_package, env_for_fdl, fdl_command, interleaved_timings, print_timings, trees


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--baseline", type=Path, metavar="DIR", action="append", default=[],
                        help="another fdl checkout, measured alongside (repeatable)")
    args = parser.parse_args()
    compile_package(args.baseline)
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        etc = base / "etc-ssh"
        (etc / "sshd_config.d").mkdir(parents=True)
        host_key = etc / "ssh_host_ed25519_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        (etc / "sshd_config").write_text(f"Include {etc}/sshd_config.d/*.conf\nPort 22\nHostKey {host_key}\n"
                                         f"UsePAM no\nSubsystem sftp internal-sftp\n")
        env = env_for_fdl()
        fdl = fdl_command()
        commands = {"python3 -c pass": ([PY, "-c", "pass"], env)}
        flags = ["join-config", "b300", "--controller", f"op@127.0.0.1:{port}", "--cloud-init", "--yes",
                 "--sshd-config", str(etc / "sshd_config")]
        for tag, tree_env in trees(env, args.baseline, base / ".caches").items():
            name = tag.strip(" []") or "this"
            project = base / f"proj-{name}"
            home = base / f"home-{name}"
            project.mkdir()
            home.mkdir(mode=0o755)
            (project / "fdl.yml").write_text("commands:\n  test:\n    run: 'true'\n")
            run_env = {**tree_env, "HOME": str(home), "XDG_STATE_HOME": str(home / ".state")}
            line = " ".join(map(str, [*fdl, *flags]))
            fresh = ["/bin/sh", "-c", f"cd {project} && rm -rf .fdl fdl.b300.yml && exec {line}"]
            rerun = ["/bin/sh", "-c", f"cd {project} && exec {line}"]
            commands[f"join-config first run{tag}"] = (fresh, run_env)
            commands[f"join-config re-run{tag}"] = (rerun, run_env)
            # the first run must succeed, or there is nothing to measure
            done = subprocess.run(fresh, env=run_env, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"join-config{tag} failed:\n{done.stderr}", file=sys.stderr)
                return 1
        results = interleaved_timings(commands, runs=args.runs, cwd=base)
    bare = results["python3 -c pass"]
    print_timings([(name, timing, bare) for name, timing in results.items()])
    print(f"load average: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
