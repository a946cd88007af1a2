"""The repository's declared top level: the Ansible content once, at the root, and the flodl.fdl collection
assembled from it (fdl/collection.py), carrying what its plugins import so that it needs nothing else."""

from __future__ import annotations

import ast
import configparser
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from fdl import collection
from tests.conftest import REPO

TOP_LEVEL = ("roles", "playbooks", "library", "inventory_plugins", "templates", "molecule")


IN_PLACE = {f"{collection.RELATIVE.as_posix()}/{path}": target for path, target in collection.IN_PLACE.items()}


def git_entries() -> list[tuple[str, str]]:
    """(mode, path) of every tracked file."""
    done = subprocess.run(["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=True)
    return [(meta.split()[0], path) for meta, path in (line.split("\t", 1) for line in done.stdout.splitlines())]


def tracked() -> list[str]:
    """Every tracked file but the in-place collection's links (the only symbolic links committed)."""
    entries = git_entries()
    links = sorted(path for mode, path in entries if mode == "120000")
    assert links == sorted(IN_PLACE), f"symbolic links committed outside the in-place collection: {links}"
    return [path for mode, path in entries if mode != "120000"]


def digest(path: str) -> str:
    return hashlib.sha256((REPO / path).read_bytes()).hexdigest()


def test_the_declared_top_level_holds_the_ansible_content():
    for name in TOP_LEVEL:
        assert (REPO / name).is_dir(), name
    assert sorted(p.name for p in (REPO / "roles").iterdir()) == [
        "fdl_dispatch", "fdl_execution_node", "fdl_join_door", "fdl_join_worker", "fdl_nccl", "fdl_prebuild",
        "fdl_probe", "fdl_reap"]
    assert (REPO / "playbooks" / "probe.yml").is_file() and (REPO / "library" / "fdl_probe.py").is_file()
    assert (REPO / "inventory_plugins" / "cluster.py").is_file()
    assert (REPO / collection.METADATA / "galaxy.yml").is_file()


def test_git_holds_each_role_playbook_and_plugin_once_and_nothing_generated():
    paths = tracked()
    assert not [p for p in paths if "ansible_collections" in Path(p).parts], "a collection tree is committed"
    # ... but for the links that make a clone the collection in place (below)
    assert not [p for p in paths if "module_utils" in Path(p).parts or "plugin_utils" in Path(p).parts]
    content = [p for p in paths if Path(p).parts[0] in ("roles", "playbooks", "library", "inventory_plugins")]
    assert len(content) > 60
    by_digest: dict[str, list[str]] = {}
    for path in paths:
        by_digest.setdefault(digest(path), []).append(path)
    copies = {p: by_digest[digest(p)] for p in content if len(by_digest[digest(p)]) > 1}
    assert not copies, f"committed twice: {copies}"
    # what the build copies in from the package is never committed a second time
    shipped = {digest(rel) for rel in paths if rel.startswith("fdl/") and rel.endswith(".py")}
    shipped_elsewhere = [p for p in paths if not p.startswith(("fdl/", "tests/")) and digest(p) in shipped
                         and (REPO / p).stat().st_size > 0]
    assert not shipped_elsewhere, shipped_elsewhere


def test_a_clone_in_place_is_the_collection_through_links_to_its_parts():
    """ansible_collections/flodl/fdl/ holds relative links and nothing else, each to the part it stands for, and
    the repository's ansible.cfg puts the root on the collections path first (tests/integration/test_in_place.py
    runs it)."""
    for link, target in IN_PLACE.items():
        path = REPO / link
        assert path.is_symlink(), link
        assert not Path(path.readlink()).is_absolute(), f"{link} -> {path.readlink()}: an absolute link"
        assert path.resolve() == (REPO / target).resolve(), f"{link} -> {path.readlink()}, not {target}"
    on_disk = {p.relative_to(REPO).as_posix() for p in (REPO / collection.RELATIVE).rglob("*")
               if p.is_symlink() or not p.is_dir()}
    on_disk = {p for p in on_disk if not any(p.startswith(link + "/") for link in IN_PLACE)}
    assert on_disk == set(IN_PLACE), on_disk ^ set(IN_PLACE)
    config = configparser.ConfigParser()
    config.read(REPO / "ansible.cfg")
    assert config["defaults"]["collections_path"].split(":")[0] == "."
    assert "library" not in config["defaults"] and "module_utils" not in config["defaults"]


def test_the_collection_tree_maps_every_part_once(tmp_path):
    root = collection.assemble(tmp_path)
    galaxy = yaml.safe_load((root / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"]) == ("flodl", "fdl")
    assert (root / "plugins" / "modules" / "fdl_probe.py").read_bytes() == (
        REPO / "library" / "fdl_probe.py").read_bytes()
    assert (root / "plugins" / "inventory" / "cluster.py").read_bytes() == (
        REPO / "inventory_plugins" / "cluster.py").read_bytes()
    assert (root / "roles" / "fdl_probe" / "tasks" / "probe.yml").is_file()
    assert not (root / "collection").exists() and not (root / "library").exists()


def _reader_files(tmp_path: Path) -> dict[str, Path]:
    """The configuration reader as the collection carries it: {path under plugin_utils/fdl: file}."""
    root = collection.assemble(tmp_path / "tree")
    base = root / "plugins" / "plugin_utils" / "fdl"
    return {p.relative_to(base).as_posix(): p for p in base.rglob("*.py")}


def test_the_reader_the_collection_carries_is_closed_under_its_imports(tmp_path):
    """Every import of the reader is the standard library, PyYAML (ansible-core requires it) or a file the
    collection carries beside it, reached relatively: nothing needs the fdl package."""
    files = _reader_files(tmp_path)
    assert {"cluster/inventory.py", "config/project.py", "config/schema.py", "errors.py", "__init__.py"} <= set(files)
    for rel, path in files.items():
        package = Path(rel).parent.parts  # the importing module's package, under fdl/
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                assert node.level - 1 <= len(package), f"{rel}: import beyond the package"
                parts = (*base, *(node.module.split(".") if node.module else ()))
                candidates = ["/".join(parts) + ".py", "/".join((*parts, "__init__.py"))]
                if node.module is None or any(c.endswith("__init__.py") for c in candidates if c in files):
                    candidates += ["/".join((*parts, name.name)) + ".py" for name in node.names]
                assert any(c in files for c in candidates), f"{rel}: {ast.unparse(node)} is not carried"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    top = name.split(".")[0]
                    assert top in sys.stdlib_module_names or top in ("__future__", "yaml"), f"{rel}: {name}"


def test_the_reader_reads_a_project_from_the_collection_alone(tmp_path):
    """Under an interpreter that cannot import fdl: the collection's reader builds the inventory by itself."""
    tree = collection.assemble(tmp_path / "tree").parents[2]
    project = tmp_path / "project"
    project.mkdir()
    (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    (project / "fdl.cluster.yml").write_text("cluster:\n  workers:\n    - {host: a, address: 10.0.0.9, user: op}\n")
    code = (
        "import sys\n"
        "sys.path[:0] = sys.argv[1:3]\n"
        "try:\n    import fdl\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit('fdl is importable')\n"
        "from ansible_collections.flodl.fdl.plugins.plugin_utils.fdl.cluster.inventory import inventory_from_file\n"
        "from pathlib import Path\n"
        "inv, _ = inventory_from_file(Path(sys.argv[3]) / 'fdl.cluster.yml')\n"
        "print(inv.hosts['a'].vars['ansible_host'], inv.hosts['a'].vars['ansible_user'])\n"
        "print(sorted(m for m in sys.modules if m == 'fdl' or m.startswith('fdl.')))\n")
    site = tmp_path / "site"  # PyYAML alone (ansible-core's dependency), none of this environment's packages
    shutil.copytree(Path(yaml.__file__).parent, site / "yaml", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-S", "-c", code, str(tree), str(site), str(project)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["10.0.0.9 op", "[]"]


def _tasks(node):
    """Every mapping in a parsed play or task file that is a task (block, rescue and always entered)."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from _tasks(node.get(key))


def test_the_roles_and_playbooks_call_the_collections_modules_by_fqcn():
    """flodl.fdl.fdl_probe, never fdl_probe: how ansible-lint (and any user of the installed collection) resolves
    them, and what a clone resolves in place through ansible_collections/ (docs/ansible.md)."""
    modules = {p.stem for p in (REPO / "library").glob("*.py")}
    files = [p for top in ("roles", "playbooks", "molecule") for p in sorted((REPO / top).rglob("*.yml"))]
    called = []
    for path in files:
        for task in _tasks(yaml.safe_load(path.read_text())):
            short = sorted(set(task) & modules)
            assert not short, f"{path.relative_to(REPO)}: calls {short} by short name; call flodl.fdl.{short[0]}"
            called += [key.rsplit(".", 1)[1] for key in task if key.startswith(f"{collection.FQCN}.")]
    assert set(called) == modules, f"modules no role calls, or unknown ones: {set(called) ^ modules}"
