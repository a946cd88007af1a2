"""The Ansible collection flodl.fdl, and the one way a complete tree of it is made.

A clone holds the collection's parts at the top level, each once, where Ansible itself finds them in place
(the repository's ansible.cfg, docs/ansible.md): `roles/`, `playbooks/`, `library/` (the modules),
`inventory_plugins/` (the inventory plugin) and `collection/` (galaxy.yml, meta/runtime.yml, README,
changelogs, sanity ignores). `assemble()` writes the complete collection tree from them:

    galaxy.yml, meta/, README.md, ...       collection/
    LICENSE                                 LICENSE (the repository's, MIT)
    roles/                                  roles/
    playbooks/                              playbooks/
    plugins/modules/                        library/
    plugins/inventory/                      inventory_plugins/

The modules import the code fdl runs on managed hosts, which is one package, fdl/hostside/ (standard
library only, Python 3.8, relative imports within it: the probe's check library, the rank supervisor, the
launcher's staging layout, the farm's sshd and authorized_keys helpers, libtorch's host-side core, the
atomic write). It is the collection's module_utils, file for file, and beside it pynvml, which a target
cannot be assumed to have; every file is copied in as a real file:

    plugins/module_utils/<path>             fdl/hostside/<path>, every *.py but the package's own __init__.py
                                            (module_utils() lists them: nothing here names a file)
    plugins/module_utils/pynvml_packed.py   nvidia-ml-py's pynvml.py, packed (below), its licence beside it;
                                            checks/nvml.py finds it as its sibling ..pynvml_packed

The inventory plugin reads an fdl project with fdl's own configuration reader, which the collection carries
too, so that `ansible-galaxy collection install` is the whole install (the fdl package is not on the index):

    plugins/plugin_utils/fdl/<path>         fdl/<path> for fdl/cluster/inventory.py and every file it reaches
                                            through relative imports, with the packages' __init__.py on the
                                            way (reader(): the configuration, fdl.errors, the host-side
                                            devices, fsio and libtorch variants; standard library and PyYAML,
                                            which ansible-core requires)

Three callers, one tree: `scripts/build-collection` (then `ansible-galaxy collection build` makes the
tarball), the wheel build (hatch_build.py puts the tree inside the wheel), and fdl run from a clone
(`built_in_cache()` builds it once into the cache, under a key of fdl's version and a hash of every input,
so an edit in the clone gets a fresh tree and a finished one is never rewritten). Standard library,
fdl.errors and fdl.hostside.paths only: the wheel build imports this file.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
import zlib
from functools import lru_cache
from pathlib import Path

from fdl.errors import FdlError
from fdl.hostside.paths import cache_dir

NAMESPACE, NAME = "flodl", "fdl"
#: The ansible-core lines supported, stated once. The collection (roles, modules, inventory plugin) runs under
#: every one of them: meta/runtime.yml's requires_ansible and each role's min_ansible_version say so. The fdl
#: command installs the newer ones only (pyproject.toml's ansible-core bound: its controller matrix starts at
#: 2.19, the newest line Python 3.11 gets). tests/unit/test_ansible_versions.py holds those files, the docs and
#: the lines the tests run to these two tuples.
ANSIBLE_CORE_LINES = ("2.17", "2.18", "2.19", "2.20", "2.21")
COMMAND_ANSIBLE_CORE_LINES = ANSIBLE_CORE_LINES[2:]
FQCN = f"{NAMESPACE}.{NAME}"
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent  # a clone (or an sdist): the collection's parts sit beside fdl/
RELATIVE = Path("ansible_collections") / NAMESPACE / NAME

# (directory in the collection tree, top-level directory of the repository it is made from)
PARTS = (
    ("", "collection"),
    ("roles", "roles"),
    ("playbooks", "playbooks"),
    ("plugins/modules", "library"),
    ("plugins/inventory", "inventory_plugins"),
)
METADATA = "collection"  # the part holding galaxy.yml
LICENSE = "LICENSE"  # the repository's licence file (MIT, as galaxy.yml says), also at the collection's root

#: A clone used in place holds the collection too, with no build step: REPO_ROOT / RELATIVE is a committed tree
#: of relative links to the parts (ansible.cfg puts the repository root on the collections path), so that the
#: roles' FQCNs (flodl.fdl.fdl_probe) and the inventory plugin resolve to the clone's own files. {path in that
#: tree: what it links to, from the repository root}. The fdl package itself stands for plugin_utils/fdl (the
#: reader) and fdl/hostside for module_utils; pynvml is not there (a host without nvidia-ml-py says so).
IN_PLACE = {
    "galaxy.yml": f"{METADATA}/galaxy.yml",
    "meta": f"{METADATA}/meta",
    "roles": "roles",
    "playbooks": "playbooks",
    "plugins/modules": "library",
    "plugins/inventory": "inventory_plugins",
    "plugins/module_utils": "fdl/hostside",
    "plugins/plugin_utils/fdl": "fdl",
}

HOST_SIDE = PACKAGE_DIR / "hostside"  # the code that runs on managed hosts: plugins/module_utils/, file for file
READER_ROOT = "cluster/inventory.py"  # what the inventory plugin imports; reader() follows its relative imports
PYNVML_LICENSE = "pynvml.LICENSE.txt"
PYNVML_PACKED = "plugins/module_utils/pynvml_packed.py"
_PACK_FORMAT = b"zlib+base64 v1"  # in the content key: change it with pack_pynvml() so caches get a new tree


class CollectionError(FdlError):
    """The collection's source or one of its inputs is missing (a broken install or checkout), or its tree
    could not be written."""


def version() -> str:
    """fdl's version (fdl/__init__.py), read as text so the wheel build need not import the package."""
    text = (PACKAGE_DIR / "__init__.py").read_text()
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if not match:
        raise CollectionError(f"no __version__ in {PACKAGE_DIR / '__init__.py'}")
    return match.group(1)


def pynvml_file() -> Path:
    """The pynvml.py of the running environment (found, not imported)."""
    spec = importlib.util.find_spec("pynvml")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise CollectionError("pynvml (the nvidia-ml-py package) is not installed in this Python; the collection "
                              "vendors it for the hosts. Install it: pip install nvidia-ml-py")
    return Path(spec.origin).resolve()


def pynvml_license(source: str) -> str:
    """The licence block at the head of pynvml.py (its only copy: the distribution ships no licence file)."""
    lines = []
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip() if line.strip("#") else "")
    text = "\n".join(lines).strip()
    if "Redistribution and use" not in text:
        raise CollectionError("pynvml.py does not start with its licence block; refusing to vendor it without one")
    return "pynvml.py is vendored from NVIDIA's nvidia-ml-py distribution under this licence:\n\n" + text + "\n"


def pack_pynvml(source: bytes) -> str:
    """pynvml.py as a module_utils file that parses instantly: the source compressed into one literal, and
    `load()` that runs it as the module `pynvml` (once per process; Python 3.8+ on the host, standard library)."""
    blob = base64.b64encode(zlib.compress(source, 9)).decode("ascii")
    chunks = "".join(f'    "{blob[i:i + 100]}"\n' for i in range(0, len(blob), 100))
    return (
        '"""NVIDIA\'s pynvml.py (nvidia-ml-py, BSD licence in pynvml.LICENSE.txt beside this file), packed by fdl:\n'
        "the unchanged source, zlib-compressed and base64-encoded, so that Ansible's payload builder does not\n"
        'parse 330 KB of Python on every run. `load()` runs it as the module `pynvml`."""\n\n'
        "from __future__ import annotations\n\nimport base64\nimport sys\nimport types\nimport zlib\n\n"
        f"_PACKED = (\n{chunks})\n\n\n"
        "def load():\n"
        '    """The module pynvml, run from the packed source on first use."""\n'
        '    module = sys.modules.get("pynvml")\n'
        "    if module is not None:\n"
        "        return module\n"
        '    module = types.ModuleType("pynvml")\n'
        '    module.__file__ = __file__\n'
        '    sys.modules["pynvml"] = module\n'
        "    try:\n"
        '        exec(compile(zlib.decompress(base64.b64decode("".join(_PACKED))), "pynvml.py", "exec"),\n'
        "             module.__dict__)\n"
        "    except BaseException:\n"
        '        del sys.modules["pynvml"]\n'
        "        raise\n"
        "    return module\n"
    )


def _python_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)


def module_utils() -> dict[str, Path]:
    """{path under plugins/module_utils: file}: every Python file of fdl/hostside/ at its own path (the
    package's __init__.py aside: module_utils is the collection's namespace, not a package of fdl's)."""
    return {p.relative_to(HOST_SIDE).as_posix(): p for p in _python_files(HOST_SIDE) if p != HOST_SIDE / "__init__.py"}


def reader() -> list[str]:
    """fdl/<path> of every file the configuration reader needs: READER_ROOT, what it imports relatively
    (function-level imports too), and the __init__.py of every package on the way, sorted."""
    found: set[str] = set()
    todo = [READER_ROOT]
    while todo:
        rel = todo.pop()
        if rel in found:
            continue
        found.add(rel)
        parts = Path(rel).parent.parts
        todo += ["/".join((*parts[:i], "__init__.py")) for i in range(len(parts) + 1)]
        for node in ast.walk(ast.parse((PACKAGE_DIR / rel).read_text(), rel)):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = parts[:len(parts) - (node.level - 1)]
            target = (*base, *(node.module.split(".") if node.module else ()))
            names = [(*target, alias.name) for alias in node.names]  # `from .pkg import module`
            for candidate in [target, *names]:
                for path in ("/".join(candidate) + ".py", "/".join((*candidate, "__init__.py"))):
                    if (PACKAGE_DIR / path).is_file():
                        todo.append(path)
    return sorted(found)


def check_source(source: Path) -> None:
    """Raise CollectionError unless `source` holds the collection's parts (collection/galaxy.yml and the rest)."""
    missing = [part for _, part in PARTS if not (source / part).is_dir()]
    missing += [name for name in (f"{METADATA}/galaxy.yml", LICENSE) if not (source / name).is_file()]
    if missing:
        raise CollectionError(f"the {FQCN} collection's source is incomplete in {source} (missing: "
                              f"{', '.join(missing)})",
                              hint="use a complete clone of fdl, or reinstall fdl")


def _inputs(source: Path) -> list[tuple[str, Path]]:
    """(path in the tree, file it comes from) for every file of the complete collection."""
    files = []
    for where, part in PARTS:
        for path in sorted((source / part).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                rel = path.relative_to(source / part).as_posix()
                files.append((f"{where}/{rel}" if where else rel, path))
    files.append((LICENSE, source / LICENSE))
    for rel, origin in module_utils().items():
        files.append((f"plugins/module_utils/{rel}", origin))
    for rel in reader():
        files.append((f"plugins/plugin_utils/fdl/{rel}", PACKAGE_DIR / rel))
    files.append((PYNVML_PACKED, pynvml_file()))
    return files


def assemble(dest: Path, source: Path | None = None) -> Path:
    """Write the complete collection under dest/ansible_collections/flodl/fdl and return that directory.

    `source` is the directory holding the parts (a clone's root, the default)."""
    source = source or REPO_ROOT
    check_source(source)
    root = dest / RELATIVE
    if root.exists():
        raise CollectionError(f"{root} already exists; give an empty directory")
    root.mkdir(parents=True)
    for rel, origin in _inputs(source):
        target = root / rel
        if target.exists():
            raise CollectionError(f"{rel} would be written twice into the {FQCN} tree ({origin} is the second)")
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel == PYNVML_PACKED:
            target.write_text(pack_pynvml(origin.read_bytes()))
        else:
            shutil.copyfile(origin, target)
    nvml = pynvml_file().read_text()
    (root / "plugins" / "module_utils" / PYNVML_LICENSE).write_text(pynvml_license(nvml))
    return root


def content_key(source: Path | None = None) -> str:
    """fdl's version and a hash of every input of the tree (names and contents)."""
    digest = hashlib.sha256(_PACK_FORMAT)
    for rel, origin in _inputs(source or REPO_ROOT):
        digest.update(rel.encode() + b"\0" + origin.read_bytes() + b"\0")
    return f"{version()}-{digest.hexdigest()[:16]}"


@lru_cache(maxsize=1)
def _clone_key() -> str:
    """content_key() of this clone's own source, hashed once per process (a clone does not change under a run)."""
    return content_key(REPO_ROOT)


def built_in_cache(source: Path | None = None) -> Path:
    """A collections path holding the complete tree for this clone's content, built on first use.

    Returns the directory to give Ansible as ANSIBLE_COLLECTIONS_PATH (it holds ansible_collections/). The cache
    directory is looked up on every call (HOME or XDG_CACHE_HOME may differ between calls of one process), and
    a tree removed since is built again.
    """
    key = _clone_key() if source is None or source == REPO_ROOT else content_key(source)
    target = cache_dir() / "collections" / key
    if (target / RELATIVE / "galaxy.yml").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    except OSError as exc:
        raise CollectionError(f"could not write the {FQCN} collection into fdl's cache ({exc})",
                              hint="free space or fix the permissions of that directory, or set XDG_CACHE_HOME "
                                   "to a writable one") from exc
    try:
        assemble(staging, source)
        os.rename(staging, target)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / RELATIVE / "galaxy.yml").is_file():  # not another fdl that finished it first
            raise CollectionError(f"could not write the {FQCN} collection into {target} ({exc})",
                                  hint="free space or fix the permissions of that directory") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


if __name__ == "__main__":  # `python -m fdl.collection DEST`: write the complete tree under DEST
    import sys

    try:
        print(assemble(Path(sys.argv[1])))
    except CollectionError as error:
        sys.exit(f"fdl.collection: {error.message}" + (f" ({error.hint})" if error.hint else ""))
    except OSError as error:
        sys.exit(f"fdl.collection: could not write the tree: {error}")
