"""`fdl publish` for people: what was published, how it was gated, and how workers pull it."""

from __future__ import annotations

import shlex
from typing import Any


def render_publish(data: dict[str, Any]) -> str:
    """The report of a published run (fdl.publish.report.report_data) for people."""
    m = data["manifest"]
    lines = [f"published run {data['run']} from {data['source']['spec']}"
             + (f" (commit {data['source']['commit'][:12]})" if data["source"].get("commit") else "")]
    rows = [("tree", data["tree"]), ("cwd", m["cwd"]), ("bin", m["bin"]),
            ("args", shlex.join(m["args"]) if m["args"] else "(none)")]
    if data["built"]:
        gates = [g["name"] for g in data["gates"] if g["name"] != "build"]
        rows.append(("built", f"yes: `{m['build']}` passed"
                     + (f" (libtorch {data['libtorch']['label']})" if data.get("libtorch") else " (no libtorch)")))
        if gates:
            rows.append(("gates", ", ".join(gates) + " check-built"))
    else:
        rows.append(("built", "NO: --no-build skipped the gate; nothing has compiled this tree (built: false)"))
    rows.append(("rustc", m["rustc"] or "(none on this box)"))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines.append("workers pull it with --source, the spelling that matches their key:")
    for spelling in data["worker_sources"]:
        lines.append(f"  {spelling['source']}")
        lines.append(f"      with {spelling['pairs_with']}")
    return "\n".join(lines) + "\n"
