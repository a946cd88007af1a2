"""Wheel build hook: the wheel carries the complete flodl.fdl collection tree (fdl/collection.py).

It goes under fdl/_share/collections/ansible_collections/flodl/fdl/, where fdl.resources finds it, so an
installed fdl runs its playbooks through the very collection scripts/build-collection packs, with no build
step at run time.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CollectionHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel":
            return
        sys.path.insert(0, self.root)
        try:
            from fdl import collection
        finally:
            sys.path.remove(self.root)
        self._tree = Path(tempfile.mkdtemp(prefix="fdl-wheel-collection-"))
        root = collection.assemble(self._tree)
        build_data["force_include"][str(root)] = f"fdl/_share/collections/{collection.RELATIVE.as_posix()}"

    def finalize(self, version, build_data, artifact_path):
        if getattr(self, "_tree", None) is not None:
            shutil.rmtree(self._tree, ignore_errors=True)
