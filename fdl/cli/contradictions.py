"""Contradictory options, refused in every command by one mechanism, before the command parses them.

Two kinds: an on/off flag pair (`--install-key/--no-install-key`) given both ways, found from the options
themselves; and pairs of options that exclude each other, named in EXCLUSIVE. Each is refused with one message
naming both, and the exit code of the command's contract: a usage error's 2, or what CONTRADICTION_EXIT says
(join-config refuses with 1, seed 000). fdl.cli.main installs it on every command it resolves, project commands
and subcommands included. No typer here: the tests read the tables without importing it.
"""

from __future__ import annotations

from typing import Any

#: Options of a command that exclude each other, beyond the --x/--no-x pairs (found from the options themselves):
#: command path -> ((option, option, why), ...). tests/cli/test_contradictions.py walks the command tree and holds
#: every pair here and every --x/--no-x pair to a refusal.
EXCLUSIVE: dict[str, tuple[tuple[str, str, str], ...]] = {
    "join": (("--bin", "--source", "run a binary already on this box, or fetch and build one here"),
             ("--token", "--token-file", "the run's token comes from one place")),
    "start": (("--token", "--token-file", "the run's token comes from one place"),),
    "probe": (("--cpu", "--devices", "both say what this host offers"),),
    "join-config": (("--authorized-keys", "--no-install-key",
                     "--authorized-keys names where to install the key line, and --no-install-key says not to"),),
}
#: A command whose documented contract gives contradictory flags another exit code than a usage error's 2:
#: join-config refuses them with 1, like every other refusal of its own (seed 000).
CONTRADICTION_EXIT = {"join-config": 1}


def given_options(command: Any, args: list[str]) -> list[str]:
    """The option names written on the command line, in order, up to a standalone `--` (values skipped)."""
    import click

    takes_value: dict[str, bool] = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                takes_value[name] = not param.is_flag and not param.count
    seen: list[str] = []
    words = iter(args)
    for word in words:
        if word == "--":
            break
        name = word.split("=", 1)[0] if word.startswith("--") else word
        if name not in takes_value:
            continue
        seen.append(name)
        if takes_value[name] and "=" not in word:
            next(words, None)
    return seen


def contradiction(command: Any, path: str, args: list[str]) -> str | None:
    """Why the options given contradict each other (a --x/--no-x pair given both ways, or a pair of EXCLUSIVE),
    or None."""
    import click

    seen = given_options(command, args)
    for param in command.params:
        if isinstance(param, click.Option) and param.secondary_opts:
            on = next((name for name in seen if name in param.opts), None)
            off = next((name for name in seen if name in param.secondary_opts), None)
            if on is not None and off is not None:
                first, second = sorted((on, off), key=seen.index)
                return f"{first} and {second} contradict each other: give one of them."
    for a, b, why in EXCLUSIVE.get(path, ()):
        if a in seen and b in seen:
            first, second = sorted((a, b), key=seen.index)
            return f"{first} and {second} contradict each other ({why}): give one of them."
    return None


def refuse_contradictions(command: Any, path: str) -> Any:
    """Make `command` (and every subcommand of a group) refuse contradictory options before it parses them: one
    message, the exit code of its contract (a usage error's 2; CONTRADICTION_EXIT names the exceptions)."""
    from fdl.errors import UsageError

    for name, sub in getattr(command, "commands", {}).items():
        refuse_contradictions(sub, f"{path} {name}".strip())
    parse = command.parse_args

    def parse_args(ctx: Any, args: list[str]) -> Any:
        problem = contradiction(command, path, args)
        if problem is not None:
            raise UsageError(problem, exit_code=CONTRADICTION_EXIT.get(path))
        return parse(ctx, args)

    command.parse_args = parse_args
    return command
