"""The shell recipes of README.md and docs/*.md, found, classified and run (issue 38: docs and code cannot drift).

A recipe is a fenced block whose language is sh, bash, shell or console. Each carries a marker, an HTML comment
on the last non-blank line before its fence (Markdown shows nothing of it), saying what the suite does with it:

    <!-- recipe: run -->                                 run by tests/integration/test_doc_recipes.py
    <!-- recipe: run; files: fdl.yml train.py; testbed: 2 -->   ... with what it needs (below)
    <!-- recipe: tested by tests/integration/test_x.py -->   run whole by that test (which names its commands)
    <!-- recipe: illustrative (needs a GPU box) -->      not run; the reason, in parentheses, is required

A fence with no marker fails tests/unit/test_doc_recipes.py, which names the file, line and fence and says how to
mark it. A runnable recipe runs in a fresh directory with a throwaway HOME (and XDG directories, TMPDIR), fdl,
python, torchrun and Ansible from the suite's environment first on PATH, no FDL_* setting but FDL_PORT (a free
pair of ports, so a run never takes 1337). An sh/bash recipe runs under `bash -euo pipefail`: every command must
succeed. A console recipe's `$ ` lines are commands; the lines after each are its output, compared line by line
(trailing blanks aside; a line `...` stands for any number of lines).

Options after `run`, separated by `;`:
    files: NAME ...  each NAME written into the directory first: the content of the nearest fence above the
                     recipe on the same page whose first line is `# NAME`, else the harness's stock file of that
                     name (STOCK: an empty fdl.yml, a train.py that runs under torchrun and under fdl alike)
    testbed: N       N testbed hosts (real sshds); the directory gets fdl.yml (unless a file gives it) and
                     fdl.cluster.yml listing them as CPU workers (one rank each, fdl's Python with torch, the
                     testbed's shared storage as data path)
    collection       the flodl.fdl collection built and installed; ANSIBLE_COLLECTIONS_PATH names it
    clone            the directory is a fresh copy of this clone (its files; .venv the suite's environment)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

LANGUAGES = ("sh", "bash", "shell", "console")
MARKER = re.compile(r"^\s*<!--\s*recipe:\s*(?P<body>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)\s*$")
KINDS = ("run", "tested by", "illustrative")
OPTIONS = ("files", "testbed", "collection", "clone")
HOW_TO_MARK = ("put one of these on the line right before the fence:\n"
               "    <!-- recipe: run -->                      the suite runs it (tests/recipes.py: options such as\n"
               "                                              `; files: fdl.yml`, `; testbed: 2`)\n"
               "    <!-- recipe: tested by tests/PATH.py -->  a test of its own runs it and names its commands\n"
               "    <!-- recipe: illustrative (WHY) -->       it cannot run here (a GPU, a real cloud, a second\n"
               "                                              machine...): say why")


@dataclass
class Fence:
    """One fenced block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str  # the body, dedented by the fence's own indentation
    before: list[str]  # the lines above the fence, nearest last

    @property
    def first(self) -> str:
        return next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "")


@dataclass
class Recipe:
    """A shell fence and what its marker says."""

    fence: Fence
    kind: str | None  # run | tested by | illustrative | None (unmarked)
    detail: str = ""  # the reason (illustrative) or the test's path (tested by)
    options: dict[str, str] = field(default_factory=dict)
    problem: str | None = None  # a marker that does not parse

    @property
    def where(self) -> str:
        return f"{self.fence.path.as_posix()}:{self.fence.line}"

    @property
    def name(self) -> str:
        return f"{self.where}:{self.fence.first[:40]}"


def fences(path: Path, root: Path) -> list[Fence]:
    """Every fenced block of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Fence] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, ticks = len(opening["indent"]), opening["ticks"]
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if closing and closing["ticks"][0] == ticks[0] and len(closing["ticks"]) >= len(ticks) \
                    and not closing["lang"]:
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
            j += 1
        out.append(Fence(path.relative_to(root), i + 1, opening["lang"].lower(), "\n".join(body) + "\n",
                         lines[:i]))
        i = j + 1
    return out


def _marker(fence: Fence) -> str | None:
    for line in reversed(fence.before):
        if line.strip():
            found = MARKER.match(line)
            return found["body"] if found else None
    return None


def classify(fence: Fence) -> Recipe:
    body = _marker(fence)
    if body is None:
        return Recipe(fence, None)
    if body.startswith("illustrative"):
        reason = re.fullmatch(r"illustrative\s*\((.+)\)", body)
        if reason is None:
            return Recipe(fence, "illustrative", problem="an illustrative recipe says why, in parentheses, and "
                                                         "nothing else: <!-- recipe: illustrative (WHY) -->")
        return Recipe(fence, "illustrative", reason[1].strip())
    head, *rest = [part.strip() for part in body.split(";")]
    if head.startswith("tested by"):
        target = head[len("tested by"):].strip()
        if not re.fullmatch(r"tests/[\w/.-]+\.py", target) or rest:
            return Recipe(fence, "tested by", target, problem="name one test file: <!-- recipe: tested by "
                                                               "tests/PATH.py -->")
        return Recipe(fence, "tested by", target)
    if head != "run":
        return Recipe(fence, None, problem=f"'{head}' is not a kind of recipe ({', '.join(KINDS)})")
    options: dict[str, str] = {}
    for part in rest:
        key, _, value = part.partition(":")
        key = key.strip()
        if key not in OPTIONS:
            return Recipe(fence, "run", problem=f"'{key}' is not a recipe option ({', '.join(OPTIONS)})")
        options[key] = value.strip()
    if "testbed" in options and not options["testbed"].isdigit():
        return Recipe(fence, "run", problem="testbed: takes a number of hosts")
    return Recipe(fence, "run", options=options)


def recipes(root: Path) -> list[Recipe]:
    """The recipes of README.md and docs/*.md under root, in file order."""
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [classify(f) for page in pages for f in fences(page, root) if f.lang in LANGUAGES]


def unmarked_line(recipe: Recipe) -> str:
    fence = recipe.fence
    return f"{recipe.where}: the ```{fence.lang} fence starting `{fence.first[:70]}` is neither run nor marked"


def problems_message(found: list[Recipe]) -> str:
    """What is wrong with the markers of `found`, one line per fence, and how to mark one ('' when nothing)."""
    unmarked = [unmarked_line(r) for r in found if r.kind is None and r.problem is None]
    bad = [f"{r.where}: the marker of the ```{r.fence.lang} fence starting `{r.fence.first[:70]}` does not parse: "
           f"{r.problem}" for r in found if r.problem]
    if not unmarked and not bad:
        return ""
    return "\n".join(unmarked + bad) + f"\nTo mark a fence, {HOW_TO_MARK}"


# ------------------------------------------------------------------------------------------- files and commands


def file_from_fences(recipe: Recipe, name: str) -> str | None:
    """The content a recipe's `files: NAME` takes from the page: the nearest fence above it that names NAME."""
    page = recipe.fence.path
    above = [f for f in fences_cache(page) if f.line < recipe.fence.line]
    for fence in reversed(above):
        if fence.first == f"# {name}":
            return fence.text
    return None


_FENCES: dict[Path, list[Fence]] = {}
ROOT: Path = Path(__file__).resolve().parent.parent


def fences_cache(page: Path) -> list[Fence]:
    if page not in _FENCES:
        _FENCES[page] = fences(ROOT / page, ROOT)
    return _FENCES[page]


def commands(recipe: Recipe) -> list[str]:
    """The first word of each command a recipe runs (what a `tested by` test must name)."""
    text = recipe.fence.text
    if recipe.fence.lang == "console":
        lines = [ln[2:] for ln in text.splitlines() if ln.startswith("$ ")]
    else:
        lines, joined = [], ""
        for ln in text.splitlines():
            joined += ln.rstrip("\\")
            if ln.endswith("\\"):
                continue
            lines.append(joined)
            joined = ""
    words = []
    for line in lines:
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line.split("#", 1)[0].strip()):
            tokens = [t for t in part.split() if not re.fullmatch(r"\w+=.*", t)]
            if tokens and tokens[0] not in SHELL_WORDS:
                words.append(tokens[0])
    return list(dict.fromkeys(words))


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """A console recipe as (command, expected output lines) pairs."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line.rstrip())
    return steps


def matches(expected: list[str], got: list[str]) -> bool:
    """Whether output lines match expected ones; an expected `...` stands for any number of lines."""
    while expected and not expected[-1]:
        expected = expected[:-1]
    while got and not got[-1]:
        got = got[:-1]
    if not expected:
        return not got
    if expected[0] == "...":
        return any(matches(expected[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and expected[0] == got[0] and matches(expected[1:], got[1:])


SHELL_WORDS = ("cd", "export", "set", "source", ".", "echo", "true", "printf", "kill", "rm", "ls", "cat", "mkdir")
STOCK = {
    "fdl.yml": "# an fdl project with no commands of its own\ncommands: {}\n",
    "train.py": '''\
"""A training script written for torchrun: init_process_group from the environment, one all-reduce, a line per
rank. It takes any arguments (--epochs, --lr, ...) and says which it got."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"rank {dist.get_rank()}/{dist.get_world_size()}: sum {int(value.item())}, args {' '.join(sys.argv[1:])}")
dist.destroy_process_group()
''',
}


# ------------------------------------------------------------------------------------------- fdl's own words


def fdl_lines(text: str) -> list[list[str]]:
    """The words after `fdl` of every fdl command a shell fence holds (continuations joined, comments and the
    environment assignments before it left out, `$ ` prompts taken off)."""
    import shlex

    out, joined = [], ""
    for raw in text.splitlines():
        line = raw[2:] if raw.startswith("$ ") else raw
        joined += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        try:
            words = shlex.split(joined, comments=True)
        except ValueError:
            words = []
        joined = ""
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            words = words[1:]
        for start in [i for i, w in enumerate(words) if w == "fdl" and (i == 0 or words[i - 1] in ("&&", "||", ";"))]:
            tail = words[start + 1:]
            end = next((i for i, w in enumerate(tail) if w in ("&&", "||", ";", "|", "&")), len(tail))
            out.append(tail[:end])
    return out


def unknown_options(words: list[str], tree: list[dict]) -> list[str]:
    """The options an fdl command line names that fdl does not have there, or a command it does not have; []
    when every word is known. `tree` is tests/cli/command_tree.py's walk of fdl, from a project whose fdl.yml
    has a cluster command `train`: any other project command is taken as one like it. Words after a bare `--`
    are the ranks' own."""
    rows = {tuple(row["path"]): row for row in tree}
    if words and words[0].startswith("@"):
        words = words[1:]
    if "--" in words:
        words = words[:words.index("--")]
    path: tuple[str, ...] = ()
    wrong: list[str] = []
    i = 0
    while i < len(words):
        word, row = words[i], rows[path]
        shown = " ".join(("fdl", *path))
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            option = next((p for p in row["params"] if p["kind"] == "option" and flag in p["opts"]), None)
            if option is None:
                wrong.append(f"{shown} {flag}")
            elif option["takes_value"] and "=" not in word:
                i += 1  # its value
        elif row["group"]:
            nxt = (*path, word)
            if nxt not in rows and path == () and ("train",) in rows:
                nxt = ("train",)  # a project command: what the page's fdl.yml defines, a launcher run
            if nxt not in rows:
                wrong.append(f"{shown} {word}: no such command")
                break
            path = nxt
        i += 1
    return wrong
