"""Every shell recipe of README.md and docs/*.md is run by the suite or marked as not runnable here, by name
(tests/recipes.py has the markers; tests/integration/test_doc_recipes.py runs the runnable ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.recipes import (
    STOCK,
    classify,
    commands,
    console_steps,
    fences,
    file_from_fences,
    matches,
    problems_message,
    recipes,
)


def test_every_shell_fence_in_the_docs_is_run_or_marked() -> None:
    found = recipes(REPO)
    assert len(found) > 20  # the pages were read
    message = problems_message(found)
    assert not message, message


def test_a_recipe_tested_elsewhere_names_a_test_that_runs_its_commands() -> None:
    for recipe in recipes(REPO):
        if recipe.kind != "tested by":
            continue
        test = REPO / recipe.detail
        assert test.is_file(), f"{recipe.where}: {recipe.detail} is not a file"
        text = test.read_text()
        missing = [word for word in commands(recipe) if word not in text and Path(word).name not in text]
        assert not missing, f"{recipe.where}: {recipe.detail} never names {missing}"


def test_every_file_a_runnable_recipe_takes_is_there() -> None:
    for recipe in recipes(REPO):
        for name in recipe.options.get("files", "").split():
            assert file_from_fences(recipe, name) is not None or name in STOCK, \
                f"{recipe.where}: files: {name} is neither in a fence above it (first line `# {name}`) nor stock"


def _page(tmp_path: Path, text: str) -> list:
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(text)
    return [classify(f) for f in fences(page, tmp_path) if f.lang in ("sh", "bash", "shell", "console")]


def test_an_unmarked_fence_is_named_with_its_line_and_how_to_mark_it(tmp_path: Path) -> None:
    found = _page(tmp_path, "# A page\n\nSome prose.\n\n```sh\nfdl probe --cpu\n```\n\n```yaml\na: 1\n```\n")
    assert len(found) == 1 and found[0].kind is None
    message = problems_message(found)
    assert message.startswith("docs/page.md:5: the ```sh fence starting `fdl probe --cpu` is neither run nor marked\n")
    assert "<!-- recipe: illustrative (WHY) -->" in message and "<!-- recipe: run -->" in message


def test_markers_are_read_from_the_line_before_the_fence_and_checked(tmp_path: Path) -> None:
    text = ("<!-- recipe: illustrative (needs a GPU box) -->\n```sh\nfdl nccl build\n```\n"
            "1. A step:\n\n   <!-- recipe: run; files: fdl.yml train.py; testbed: 2 -->\n"
            "   ```bash\n   fdl train\n   ```\n"
            "<!-- recipe: illustrative -->\n```console\n$ fdl x\n```\n"
            "<!-- recipe: tested by tests/integration/test_try_walk_in.py -->\n"
            "```sh\nexamples/cluster/try-walk-in\n```\n"
            "<!-- recipe: run; gpus: 2 -->\n```sh\nfdl train\n```\n"
            "<!-- recipe: skip -->\n```sh\nfdl train\n```\n")
    gpu, step, bare, tested, option, kind = _page(tmp_path, text)
    assert (gpu.kind, gpu.detail, gpu.problem) == ("illustrative", "needs a GPU box", None)
    assert step.kind == "run" and step.options == {"files": "fdl.yml train.py", "testbed": "2"}
    assert step.fence.text == "fdl train\n" and step.fence.line == 8
    assert bare.problem and "says why" in bare.problem
    assert tested.kind == "tested by" and tested.detail == "tests/integration/test_try_walk_in.py"
    assert option.problem == "'gpus' is not a recipe option (files, testbed, collection, clone)"
    assert kind.kind is None and kind.problem and "'skip' is not a kind of recipe" in kind.problem


def test_commands_and_console_output() -> None:
    from tests.recipes import Fence, Recipe

    text = "GLOO_SOCKET_IFNAME=lo fdl a \\\n  --b # c\nansible-playbook -i h p.yml && cd /x\n"
    fence = Fence(Path("x.md"), 1, "sh", text, [])
    assert commands(Recipe(fence, "run")) == ["fdl", "ansible-playbook"]  # cd: the shell's own
    steps = console_steps("$ ansible-inventory --graph\n@all:\n  |--@ungrouped:\n$ true\n")
    assert steps == [("ansible-inventory --graph", ["@all:", "  |--@ungrouped:"]), ("true", [])]
    assert matches(["@all:", "...", "  |--b"], ["@all:", "  |--a", "  |--b", ""])
    assert not matches(["@all:", "  |--b"], ["@all:", "  |--a", "  |--b"])


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> list[dict]:
    """fdl's commands and options, walked in a fresh interpreter, with a project cluster command `train`."""
    from tests.cli.command_tree import command_tree

    project = tmp_path_factory.mktemp("project")
    (project / "fdl.yml").write_text("commands:\n  train: {cluster: true, run: 'true'}\n")
    return command_tree(project)


def test_every_fdl_option_a_recipe_names_is_one_fdl_has(tree) -> None:
    """Illustrative recipes too: they cannot run here, but the options they show must be fdl's (a renamed or
    removed option fails here, naming the recipe)."""
    from tests.recipes import fdl_lines, unknown_options

    wrong = [f"{r.where}: fdl {' '.join(words)}: {', '.join(bad)}" for r in recipes(REPO)
             for words in fdl_lines(r.fence.text) if (bad := unknown_options(words, tree))]
    assert not wrong, "\n".join(wrong)


def test_the_option_check_finds_a_stale_option(tree) -> None:
    from tests.recipes import fdl_lines, unknown_options

    text = "GLOO_SOCKET_IFNAME=lo fdl @cluster probe --strict \\\n  --skip-mount  # c\nls && fdl start --addr h:1\n"
    assert fdl_lines(text) == [["@cluster", "probe", "--strict", "--skip-mount"], ["start", "--addr", "h:1"]]
    assert unknown_options(["@cluster", "probe", "--strict", "--skip-mount"], tree) == []
    assert unknown_options(["--gpus", "0,1", "train", "--no-prebuild", "--", "--lr", "0.1"], tree) == []
    assert unknown_options(["nccl", "build", "--jobz", "8"], tree) == ["fdl nccl build --jobz"]
    assert unknown_options(["libtorch", "fetch", "cpu"], tree) == ["fdl libtorch fetch: no such command"]
