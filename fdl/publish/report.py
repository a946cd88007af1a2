"""What `fdl publish` reports, as data: the JSON twin, and what the human text (fdl.cli.render.publish) is
rendered from, so the two never disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fdl.publish.manifest import MANIFEST_NAME
from fdl.publish.run import TREE_NAME, PublishResult


def worker_sources(served: Path, host: str, user: str | None) -> list[dict[str, Any]]:
    """The two source spellings a worker can use, each with the key it pairs with."""
    login = f"{user}@" if user else ""
    restricted = f'command="rrsync -ro -munge {served}",restrict'
    return [
        {"source": f"rsync://{login}{host}:/{TREE_NAME}", "key": "rrsync",
         "authorized_keys_options": restricted,
         "pairs_with": f"a key restricted to the served directory: {restricted} in authorized_keys (rrsync "
                       f"re-roots every path at {served})"},
        {"source": f"rsync://{login}{host}:{served / TREE_NAME}", "key": "plain",
         "authorized_keys_options": None,
         "pairs_with": "an ordinary ssh key without a forced command (the absolute path; behind an rrsync key "
                       "it would be rooted twice and fail)"},
    ]


def report_data(result: PublishResult, *, host: str, user: str | None) -> dict[str, Any]:
    """The report as data: the JSON twin, and what the human text is rendered from."""
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
            "found_by": result.libtorch.found_by, "feature": result.libtorch.feature},
        "gates": [{"name": g.name, "libtorch": g.libtorch, "target_dir": g.target_dir, "recipe": g.recipe,
                   "passed": True} for g in result.gates],
        "built": manifest.built,
        "from": dict(request.origins),
        "worker_sources": worker_sources(request.served, host, user),
        "notes": list(result.notes),
    }
