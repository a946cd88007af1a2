"""fdl's packages form layers: a module imports its own package or a package of a lower layer, never one
of its own layer or above; every name is imported from the module that defines it (one import path per
name), and no module of fdl takes another module's private (`_name`) names. Every import counts:
module-level, function-level (lazy) and TYPE_CHECKING ones alike.

The order, highest first, is written once, here:

    fdl/__main__.py                      `python -m fdl`
    cli                                  parse, call the library, render
    runcmd                               the project's commands run through the launcher
    launch                               a cluster run: plan, prebuild, stage, rank sessions
    agent, farm, nccl                    `fdl join` (which fetches published runs), join-config and the NCCL
                                         build (both run playbooks through cluster)
    controller, cluster                  the run's endpoint and its clients (live runs, addresses); inventory,
                                         Ansible and ssh
    publish                              the published run tree (its build gate runs under libtorch's
                                         environment)
    libtorch                             downloads, mirrors, activation, the build environment
    config                               fdl.yml: discovery, overlays, schema (the base every command reads:
                                         the value parsers the schema and libtorch share live here)
    offer, gpus, resources, progress,    this box's GPU offer (libtorch's `auto` asks it), the --gpus selection,
    signals, collective                  shipped files, the progress display, Ctrl-C handling, the all-reduce
                                         smoke test's options and results (the cluster probe combines them;
                                         its host side is hostside's)
    collection                           the flodl.fdl collection tree (resources builds it)
    errors, hostside, fdl/__init__.py    the error hierarchy; the code that runs on managed hosts, which
                                         imports nothing of fdl (tests/unit/hostside/test_imports.py); the version

Inside a package (a unit of the list, its subpackages included) the modules form layers too: their imports of
each other make a directed acyclic graph, every import counted as above (a lazy or TYPE_CHECKING import is how
a cycle hides, so it counts). The order is the graph's own (a module sits above everything it imports), so no
second list can go stale; a cycle fails the test with its modules named, and is mended by moving the shared
piece down (fdl.config.keypath under source and yamldoc, hostside.checks.devices.Selection under gpu and health)
or by passing a value in (fdl.controller.metrics reads the server through its Scraped protocol).

A package that is not in the list fails the test until it is given its place.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "fdl"
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli",),
    ("runcmd",),
    ("launch",),
    ("agent", "farm", "nccl"),
    ("controller", "cluster"),
    ("publish",),
    ("libtorch",),
    ("config",),
    ("offer", "gpus", "resources", "progress", "signals", "collective"),
    ("collection",),
    ("errors", "hostside", "__init__"),
)
RANK = {unit: row for row, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The layer unit of a module name under fdl: its first component (`fdl` itself is `__init__`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def is_module(root: Path, module: str) -> bool:
    path = root.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path, root: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line, module imported, name taken from it or None) for every import of a file under root (the fdl
    package directory), relative ones resolved to absolute names."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                yield node.lineno, module, alias.name


def wrong_way(root: Path) -> list[str]:
    """Every import of a package in the same layer or above, and every package missing from LAYERS."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "_share" in path.relative_to(root).parts:
            continue
        here = unit_of(module_name(path, root))
        if here not in RANK:
            found.append(f"{path.relative_to(root)}: package {here!r} has no place in LAYERS")
            continue
        for line, module, name in imports(path, root):
            if module.split(".")[0] != root.name:
                continue
            target = f"{module}.{name}" if name and is_module(root, f"{module}.{name}") else module
            there = unit_of(target)
            if there == here:
                continue
            if there not in RANK or RANK[there] <= RANK[here]:
                found.append(f"{path.relative_to(root)}:{line} ({here}) imports {target} ({there})")
    return found


def module_cycles(root: Path) -> list[str]:
    """Every cycle among the modules of one package (its subpackages included): each strongly connected
    component of the module import graph with more than one module, as `unit: a -> b (file:line); ...`."""
    edges: dict[str, dict[str, str]] = {}
    for path in sorted(root.rglob("*.py")):
        if "_share" in path.relative_to(root).parts:
            continue
        here = module_name(path, root)
        out = edges.setdefault(here, {})
        for line, module, name in imports(path, root):
            if module.split(".")[0] != root.name:
                continue
            target = f"{module}.{name}" if name and is_module(root, f"{module}.{name}") else module
            if target != here and unit_of(target) == unit_of(here):
                out.setdefault(target, f"{path.relative_to(root)}:{line}")
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[str] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                members = sorted(component)
                where = [f"{a} -> {b} ({edges[a][b]})" for a in members for b in members if b in edges.get(a, {})]
                found.append(f"{unit_of(node)}: " + "; ".join(where))

    for node in list(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def _defines(tree: ast.Module) -> set[str]:
    """Names a module binds itself at its top level (imports excluded), through if/try blocks too."""
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return names


def second_paths(root: Path, callers: list[Path]) -> list[str]:
    """Every `from fdl.X import name` (in root and in callers) where X does not define name itself (a name
    reached through a module that only imported it), every `import a as a` re-export spelling, and every
    __all__ naming an imported name."""
    defined: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        if "_share" not in path.relative_to(root).parts:
            defined[module_name(path, root)] = _defines(ast.parse(path.read_text()))
    found = []
    for path in sorted({*root.rglob("*.py"), *callers}):
        if "_share" in path.parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(root.parent)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [f"{where}:{node.lineno} re-exports {a.name} as itself" for a in node.names
                          if a.asname and a.asname == a.name.rpartition(".")[2]]
        if path.is_relative_to(root):
            own = defined[module_name(path, root)]
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                    listed = [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
                    found += [f"{where}: __all__ lists {n}, imported" for n in listed
                              if n not in own and not is_module(root, f"{module_name(path, root)}.{n}")]
        lines = imports(path, root) if path.is_relative_to(root) else _absolute(tree)
        for line, module, name in lines:
            if name is None or name == "*" or module not in defined or is_module(root, f"{module}.{name}"):
                continue
            if name not in defined[module]:
                found.append(f"{where}:{line} imports {name} from {module}, which does not define it")
    return found


def private_reaches(root: Path) -> list[str]:
    """Every import in root of a `_private` name from another module."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "_share" in path.relative_to(root).parts:
            continue
        for line, module, name in imports(path, root):
            if name and name.startswith("_") and not name.startswith("__") and \
                    module != module_name(path, root) and not is_module(root, f"{module}.{name}"):
                found.append(f"{path.relative_to(root)}:{line} imports {module}.{name}")
    return found


def _absolute(tree: ast.Module) -> Iterator[tuple[int, str, str | None]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def callers() -> list[Path]:
    """The repository's Python outside fdl/ that imports fdl: tests, bench, scripts, plugins."""
    return [p for top in ("tests", "bench", "scripts", "inventory_plugins") for p in (REPO / top).rglob("*.py")]


def test_every_import_goes_down_the_layers():
    assert wrong_way(PACKAGE) == []


def test_the_modules_of_a_package_import_each_other_without_a_cycle():
    assert module_cycles(PACKAGE) == []


def test_every_name_has_one_import_path():
    assert second_paths(PACKAGE, callers()) == []


def test_no_module_takes_another_modules_private_names():
    assert private_reaches(PACKAGE) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "fdl"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_layer_rule_finds_wrong_way_imports(tmp_path):
    """The checker itself: an import up, a lazy one across, a TYPE_CHECKING one, a relative one, and a package
    with no place are found; imports down and within a package are not."""
    root = _package(tmp_path, {
        "config/__init__.py": "", "config/schema.py": "from ..hostside.checks import devices\nfrom . import parse\n",
        "config/parse.py": "def f():\n    from fdl.controller import view\n",  # lazy, upward
        "controller/__init__.py": "", "controller/view.py": "from fdl.config.schema import X\n",  # down: fine
        "hostside/__init__.py": "", "hostside/checks/__init__.py": "", "hostside/checks/devices.py": "",
        "agent/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fdl import farm\n",
        "farm/__init__.py": "", "newpkg/__init__.py": "",
        "publish/__init__.py": "from ..controller import view\n",  # relative, upward (once a bent back-edge)
        "libtorch/__init__.py": "from ..config import schema\n",  # relative, down
    })
    found = wrong_way(root)
    assert [line.split(" ")[0] for line in found] == [
        "agent/__init__.py:3", "config/parse.py:2", "newpkg/__init__.py:", "publish/__init__.py:1"], found


def test_the_module_rule_finds_cycles_lazy_and_type_checking_ones_too(tmp_path):
    """The checker itself: a lazy import back, a TYPE_CHECKING import back and a three-module ring are cycles;
    one-way imports, a package's __init__ importing its modules, and imports across packages are not."""
    root = _package(tmp_path, {
        "config/__init__.py": "from . import schema\n", "config/schema.py": "from fdl.config.source import Data\n",
        "config/source.py": "def read():\n    from .schema import check\n",  # lazy, back: a cycle
        "cluster/__init__.py": "", "cluster/a.py": "from . import b\n", "cluster/b.py": "from fdl.cluster import c\n",
        "cluster/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fdl.cluster.a import X\n",
        "hostside/__init__.py": "", "hostside/checks/__init__.py": "",
        "hostside/checks/gpu.py": "from .devices import Selection\n", "hostside/checks/devices.py": "",
        "agent/__init__.py": "", "agent/run.py": "from fdl.config import source\n",  # across packages: not here
    })
    found = module_cycles(root)
    assert [line.split(":")[0] for line in found] == ["cluster", "config"], found
    assert "fdl.cluster.c -> fdl.cluster.a (cluster/c.py:3)" in found[0]
    assert "fdl.config.source -> fdl.config.schema (config/source.py:2)" in found[1]


def test_the_one_path_rule_finds_second_paths(tmp_path):
    root = _package(tmp_path, {
        "checks.py": "class Devices:\n    pass\n",
        "schema.py": "from fdl.checks import Devices\nfrom fdl.checks import Devices as Devices\n"
                     "__all__ = ['Devices']\n",
        "user.py": "from fdl.schema import Devices\nfrom fdl.checks import Devices as D\n",
        "other.py": "def f():\n    from fdl.checks import _hidden\n    from . import _private_module\n",
        "_private_module.py": "",
    })
    test = tmp_path / "test_x.py"
    test.write_text("from fdl.schema import Devices\nfrom fdl.checks import Devices\n")
    found = second_paths(root, [test])
    assert sorted(line.split(" ")[0] for line in found) == [
        "fdl/other.py:2", "fdl/schema.py:", "fdl/schema.py:2", "fdl/user.py:1", "test_x.py:1"], found
    assert private_reaches(root) == ["other.py:2 imports fdl.checks._hidden"]
