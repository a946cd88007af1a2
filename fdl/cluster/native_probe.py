"""Probe this machine as a cluster worker: `python -m fdl.cluster.native_probe HOST < options.json`.

fdl @cluster probe runs this for a worker that is the machine fdl runs on,
so the worker's `env:` (LD_PRELOAD, LD_LIBRARY_PATH, ...) takes effect at
process start exactly as it does for a remote task. Reads the ProbeOptions
fields as JSON on stdin and prints the host report as JSON on stdout.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from fdl.hostside.checks.probe import ProbeOptions, run_probe

    fields = json.loads(sys.stdin.read() or "{}")
    report = run_probe(ProbeOptions(**fields), host=argv[1] if len(argv) > 1 else None)
    json.dump(report.to_dict(), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
