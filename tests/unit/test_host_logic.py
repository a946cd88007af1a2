"""Host logic has one home: fdl/hostside. Three source rules, each checked over the repository and on samples:

- files and directories move into place only through fdl/hostside/fsio.py (atomic_write, atomic_symlink,
  install_dir, retire_dir, write_probe): nothing else in fdl/, library/ or inventory_plugins/ fsyncs, renames
  or replaces on its own;
- processes are signalled and /proc is walked only by the process sweep in fdl/hostside/supervisor.py
  (signal_processes, end_processes, processes_with_env, stop_process_group);
- a module in library/ is a thin Ansible wrapper: argument handling, check mode and exit_json over fdl/hostside
  code, and nothing else. The rule, exactly: its top level is the docstring, `from __future__` imports,
  DOCUMENTATION/EXAMPLES/RETURN, imports (a `try:` of imports with an `except ImportError:` of imports for the
  collection and the clone), one `def main()` and the `if __name__ == "__main__": main()` guard; it imports
  `ansible.module_utils.basic` and fdl's host-side module_utils only (no standard library: whatever touches the
  host is host-side code); and main() holds no loop, comprehension, `with`, nested function, lambda or class.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO, docstring_ids

SCANNED = ("fdl", "library", "inventory_plugins")
FSIO = "fdl/hostside/fsio.py"
SWEEP = "fdl/hostside/supervisor.py"
OS_MOVES = {"fsync", "fdatasync", "replace", "rename", "renames"}
SHUTIL_MOVES = {"move"}
MODULE_UTILS = ("ansible_collections.flodl.fdl.plugins.module_utils", "ansible.module_utils.fdl.hostside")
DOC_BLOCKS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}


def python_files(root: Path) -> list[Path]:
    return sorted(p for top in SCANNED for p in (root / top).rglob("*.py")
                  if "_share" not in p.parts and "__pycache__" not in p.parts)


def _aliases(tree: ast.AST) -> tuple[dict[str, str], dict[str, str]]:
    """({local name: module} for `import os [as x]`, {local name: module.attr} for `from os import rename`)."""
    modules, names = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return modules, names


def _called(node: ast.Call, modules: dict[str, str], names: dict[str, str]) -> str | None:
    """`module.attr` when the call is to a module's function (through any alias), else None."""
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in modules:
        return f"{modules[func.value.id]}.{func.attr}"
    if isinstance(func, ast.Name) and func.id in names:
        return names[func.id]
    return None


def own_moves(path: Path) -> list[str]:
    """Every place a module fsyncs, renames or replaces on its own: os.fsync/fdatasync/replace/rename/renames and
    shutil.move (by any alias), a `.rename(...)` of anything (Path.rename: str has none), a `.replace(x)` with one
    argument (Path.replace: str.replace takes two), and renameat2 reached through ctypes."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    modules, names = _aliases(tree)
    docstrings = docstring_ids(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and node.value == "renameat2":
            found.append(f"renameat2 at line {node.lineno}")
        if isinstance(node, ast.Attribute) and node.attr == "renameat2":
            found.append(f"renameat2 at line {node.lineno}")
        if not isinstance(node, ast.Call):
            continue
        called = _called(node, modules, names)
        if called in {f"os.{n}" for n in OS_MOVES} | {f"shutil.{n}" for n in SHUTIL_MOVES}:
            found.append(f"{called} at line {node.lineno}")
        elif isinstance(node.func, ast.Attribute) and called is None and (
                node.func.attr == "rename" or (node.func.attr == "replace" and len(node.args) == 1
                                               and not node.keywords)):
            found.append(f".{node.func.attr}() at line {node.lineno}")
    return found


def own_sweeps(path: Path) -> list[str]:
    """Every place a module signals processes or walks /proc on its own: os.killpg, os.kill with a real signal
    (kill(pid, 0) only asks whether a process exists; a process re-raising a signal at itself is no sweep),
    Popen.terminate()/send_signal(), and a listing of /proc."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    modules, names = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = _called(node, modules, names)
        if called == "os.killpg":
            found.append(f"os.killpg at line {node.lineno}")
        elif called == "os.kill" and len(node.args) == 2:
            pid, sig = node.args
            probe = isinstance(sig, ast.Constant) and sig.value == 0
            itself = isinstance(pid, ast.Call) and _called(pid, modules, names) == "os.getpid"
            if not (probe or itself):
                found.append(f"os.kill at line {node.lineno}")
        elif called in ("os.listdir", "os.scandir") and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value == "/proc":
            found.append(f"a walk of /proc at line {node.lineno}")
        elif called is None and isinstance(node.func, ast.Attribute) and node.func.attr in ("terminate",
                                                                                            "send_signal"):
            found.append(f".{node.func.attr}() at line {node.lineno}")
    return found


def _only_imports(body: list[ast.stmt]) -> bool:
    return all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in body)


def _import_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return []


def wrapper_logic(path: Path) -> list[str]:
    """What a library/ module holds beyond a thin wrapper (the rule in this file's docstring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    imports: list[ast.stmt] = []
    mains = []
    for index, node in enumerate(tree.body):
        where = f"line {node.lineno}"
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif isinstance(node, ast.Try) and _only_imports(node.body) and not node.orelse and not node.finalbody \
                and all(isinstance(h.type, ast.Name) and h.type.id == "ImportError" and _only_imports(h.body)
                        for h in node.handlers):
            imports.extend(node.body)
            imports.extend(s for h in node.handlers for s in h.body)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in DOC_BLOCKS and isinstance(node.value, ast.Constant):
            continue
        elif isinstance(node, ast.FunctionDef) and node.name == "main" and not mains:
            mains.append(node)
        elif isinstance(node, ast.If) and ast.unparse(node) == "if __name__ == '__main__':\n    main()":
            continue
        else:
            found.append(f"{where}: {ast.unparse(node).splitlines()[0][:60]} (only main() and imports)")
    for node in imports:
        for name in _import_names(node):
            if name != "__future__" and name != "ansible.module_utils.basic" and not name.startswith(MODULE_UTILS):
                found.append(f"line {node.lineno}: imports {name} (host work is fdl/hostside's)")
    for main in mains:
        for node in ast.walk(main):
            if node is main:
                continue
            if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.ListComp,
                                 ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda, ast.FunctionDef,
                                 ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
                found.append(f"line {node.lineno}: {type(node).__name__} in main()")
    if not mains:
        found.append("no main()")
    return found


def offenders(root: Path) -> dict[str, list[str]]:
    """Every breach of the three rules in the tree at `root`, by file."""
    out: dict[str, list[str]] = {}
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        found = [] if rel == FSIO else own_moves(path)
        found += [] if rel == SWEEP else own_sweeps(path)
        if rel.startswith("library/"):
            found += wrapper_logic(path)
        if found:
            out[rel] = found
    return out


def test_host_logic_lives_in_hostside() -> None:
    """regression (#39 item 5): library/fdl_nccl_install.py had its own fsync and directory swap, library/fdl_reap.py
    its own process sweep, and a directory was moved into place four times over; the guard before this one looked
    for os.fsync/os.replace in fdl/ only."""
    assert offenders(REPO) == {}


def test_every_rule_has_its_home() -> None:
    """The exemptions are the helpers themselves, and they do what the others may not."""
    assert own_moves(REPO / FSIO) and own_sweeps(REPO / SWEEP)


SAMPLES = {
    "fdl/a.py": ("import os\nimport shutil\nfrom pathlib import Path\nfrom os import rename as mv\n"
                 "os.rename('a', 'b')\nos.replace('a', 'b')\nos.fsync(3)\nshutil.move('a', 'b')\n"
                 "Path('a').rename('b')\nPath('a').replace('b')\nmv('a', 'b')\n"
                 "'x'.replace('a', 'b')\n"),  # the last is str.replace: not a move
    "fdl/b.py": ("import ctypes\nimport os as o\nimport signal\n"
                 "ctypes.CDLL(None).renameat2\no.killpg(1, 9)\no.kill(1, signal.SIGTERM)\no.kill(1, 0)\n"
                 "o.kill(o.getpid(), 15)\no.listdir('/proc')\nproc.terminate()\n"),
    "library/m.py": ('"""doc"""\nDOCUMENTATION = "x"\nimport os\n'
                     "try:\n    from ansible_collections.flodl.fdl.plugins.module_utils.reap import reap\n"
                     "except ImportError:\n    from ansible.module_utils.fdl.hostside.reap import reap\n"
                     "from ansible.module_utils.basic import AnsibleModule\n"
                     "def helper():\n    pass\n"
                     "def main():\n    for x in []:\n        pass\n    y = [z for z in ()]\n"
                     "if __name__ == '__main__':\n    main()\n"),
    "library/ok.py": ('"""doc"""\nfrom __future__ import annotations\nDOCUMENTATION = "x"\nEXAMPLES = "y"\n'
                      "from ansible.module_utils.basic import AnsibleModule\n"
                      "try:\n    from ansible_collections.flodl.fdl.plugins.module_utils.reap import reap\n"
                      "except ImportError:\n    from ansible.module_utils.fdl.hostside.reap import reap\n"
                      "def main():\n    module = AnsibleModule(argument_spec={})\n"
                      "    try:\n        pids = reap('a', 1.0)\n    except ValueError as exc:\n"
                      "        module.fail_json(msg=str(exc))\n    module.exit_json(pids=pids)\n"
                      "if __name__ == '__main__':\n    main()\n"),
    "inventory_plugins/p.py": "from pathlib import Path\nPath('x').rename('y')\n",
}


def test_the_checker_finds_each_kind_of_breach_and_nothing_else(tmp_path: Path) -> None:
    for rel, text in SAMPLES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = offenders(tmp_path)
    lines = {rel: [int(f.split("line ")[1].split(":")[0].split()[0]) for f in items] for rel, items in found.items()}
    assert sorted(lines["fdl/a.py"]) == [5, 6, 7, 8, 9, 10, 11], found
    assert sorted(lines["fdl/b.py"]) == [4, 5, 6, 9, 10], found
    assert sorted(lines["library/m.py"]) == [3, 9, 12, 14], found
    assert lines["inventory_plugins/p.py"] == [2]
    assert "library/ok.py" not in found
