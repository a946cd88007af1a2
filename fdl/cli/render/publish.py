"""`fdl publish` for people and for scripts: what was published, how it was gated, how workers pull it.

Both views are made from the same records (fdl.publish.run.PublishResult and the worker sources of
fdl.publish.report), so the JSON twin carries everything the human text says.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from typing import Any

from fdl.publish.manifest import MANIFEST_NAME
from fdl.publish.report import WorkerSource
from fdl.publish.run import PublishResult


def publish_json(result: PublishResult, sources: list[WorkerSource]) -> dict[str, Any]:
    """The JSON twin of a published run (schema in docs/publish.md)."""
    request, manifest = result.request, result.manifest
    return {
        "published": True,
        "run": manifest.run,
        "served": str(request.served),
        "tree": str(request.tree),
        "release": None if result.release is None else str(result.release),
        "manifest_path": str(request.tree / MANIFEST_NAME),
        "manifest": manifest.to_dict(),
        "source": {"kind": request.source.kind, "spec": request.source.spec, "commit": result.commit},
        "libtorch": None if result.libtorch is None else {
            "path": str(result.libtorch.path), "label": result.libtorch.label,
            "found_by": result.libtorch.source, "feature": result.libtorch.feature},
        "gates": [{"name": g.name, "libtorch": g.libtorch, "target_dir": g.target_dir, "recipe": g.recipe,
                   "passed": True} for g in result.gates],
        "built": manifest.built,
        "from": dict(request.origins),
        "worker_sources": [asdict(source) for source in sources],
        "notes": list(result.notes),
    }


def render_publish(result: PublishResult, sources: list[WorkerSource]) -> str:
    """A published run for people."""
    request, m = result.request, result.manifest
    lines = [f"published run {m.run} from {request.source.spec}"
             + (f" (commit {result.commit[:12]})" if result.commit else "")]
    rows = [("tree", str(request.tree)), ("cwd", m.cwd), ("bin", m.bin),
            ("args", shlex.join(m.args) if m.args else "(none)")]
    if m.built:
        gates = [g.name for g in result.gates if g.name != "build"]
        rows.append(("built", f"yes: `{m.build}` passed"
                     + (f" (libtorch {result.libtorch.label})" if result.libtorch else " (no libtorch)")))
        if gates:
            rows.append(("gates", ", ".join(gates) + " check-built"))
    else:
        rows.append(("built", "NO: --no-build skipped the gate; nothing has compiled this tree (built: false)"))
    rows.append(("rustc", m.rustc or "(none on this box)"))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines.append("workers pull it with --source, the spelling that matches their key:")
    for spelling in sources:
        lines.append(f"  {spelling.source}")
        lines.append(f"      with {spelling.pairs_with}")
    return "\n".join(lines) + "\n"
