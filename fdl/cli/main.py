"""The `fdl` entry point: global selectors, lazy command loading, error boundary.

This is the only place that turns an `FdlError` into a message and an exit
code. Command modules are imported only when their command runs, so
`fdl --help` and local commands stay cheap (no ansible, requests or pynvml).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from typer.core import TyperCommand, TyperGroup

from fdl import __version__
from fdl.cli.context import Globals, Invocation
from fdl.cli.contradictions import refuse_contradictions
from fdl.cli.options import JSON_FLAG
from fdl.errors import ExitCode, FdlError
from fdl.hostside.envvars import FDL_DEBUG, FDL_ENV, read
from fdl.hostside.redact import strip_userinfo

if TYPE_CHECKING:
    from fdl.config.schema import CommandSpec
# At exit the interpreter's last garbage collections walk every object the imports made (typer, click, yaml,
# pynvml, requests, aiohttp). A process that is ending frees its memory anyway, so the collector is told to
# leave what exists by then alone (files fdl writes are closed before exit). What it saves: docs/cli.md.
atexit.register(gc.freeze)

# name -> (module, one-line help). Modules are imported on use only.
BUILTINS: dict[str, tuple[str, str]] = {
    "probe": ("fdl.cli.probe", "Audit readiness for a training run (GPU, libtorch, NCCL, data)."),
    "status": ("fdl.cli.status", "Show the live state of a cluster run."),
    "start": ("fdl.cli.start", "Fire the start switch of a staging cluster run."),
    "config": ("fdl.cli.config", "Show the resolved configuration and where each value came from."),
    "join": ("fdl.cli.join", "Join a cluster run's window as a self-deployed worker."),
    "publish": ("fdl.cli.publish", "Publish a build-gated training run for a fleet to pull."),
    "join-config": ("fdl.cli.join_config", "Set up a farm: key, token, overlay, sshd door and the steps to open it."),
    "nccl": ("fdl.cli.nccl", "Build NCCL from source to match the fleet (heterogeneous rigs)."),
    "libtorch": ("fdl.cli.libtorch", "List, download, activate and remove libtorch variants."),
}

GLOBAL_VALUE_OPTIONS = ("--env", "--gpus")
GLOBAL_FLAGS = ("--debug", "--verbose", "-v", "--version", "--help", "-h")


def _first_word(argv: list[str]) -> int:
    """The index of the first word after the global options (len(argv) when there is none)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in GLOBAL_VALUE_OPTIONS:
            i += 2
            continue
        if (word.startswith("--") and "=" in word) or word in GLOBAL_FLAGS:
            i += 1
            continue
        break
    return min(i, len(argv))


def split_sigil(argv: list[str]) -> tuple[list[str], str | None]:
    """Pull an `@NAME` word out from before the command: `fdl --gpus 0 @cluster probe`."""
    i = _first_word(argv)
    if i < len(argv) and argv[i].startswith("@"):
        return argv[:i] + argv[i + 1:], argv[i][1:]
    return argv, None


def wants_json(argv: list[str]) -> bool:
    """True when a built-in command is asked for its --json twin (before any standalone `--`).

    A project command (fdl.yml `commands:`) passes --json on to what it runs, so it is not asked here.
    """
    words = argv[_first_word(argv):]
    words = words[: words.index("--")] if "--" in words else words
    before = words[:1] == [JSON_FLAG]  # `fdl --json probe`: refused (misplaced), and answered in JSON all the same
    words = words[1:] if before else words
    return bool(words) and words[0] in BUILTINS and (before or JSON_FLAG in words[1:])


GLOBAL_OPTIONS = (*GLOBAL_VALUE_OPTIONS, "--debug", "--verbose", "-v", "--version")


def misplaced_option(exc: click.exceptions.NoSuchOption, args: list[str], sigil: str | None) -> str | None:
    """The error for an option on the wrong side of the command, with the command line put right: a global
    option after the command (`fdl probe --gpus 0`), or a command's option before it (`fdl --json probe`).
    None when the option belongs nowhere (click's own error stands)."""
    import shlex

    flag = exc.option_name.split("=", 1)[0]
    at_root = exc.ctx is None or exc.ctx.parent is None
    end = args.index("--") if "--" in args else len(args)
    found = [i for i in range(end) if args[i] == flag or args[i].startswith(flag + "=")]
    if not found:
        return None

    def line(words: list[str]) -> str:
        if sigil is not None:  # the @NAME word goes back where main() took it from
            head = _first_word(words)
            words = [*words[:head], f"@{sigil}", *words[head:]]
        return shlex.join(["fdl", *words])

    if not at_root and flag in GLOBAL_OPTIONS:
        i = found[-1]
        take = 2 if flag in GLOBAL_VALUE_OPTIONS and args[i] == flag and i + 1 < end else 1
        rest = args[:i] + args[i + take:]
        return (f"{flag} is a global option of fdl, not an option of this command: it goes before the command "
                f"name. Write: {line(args[i:i + take] + rest)}")
    if not at_root:
        return None
    i = found[0]
    for take in (2, 1) if args[i] == flag and i + 1 < end else (1,):
        rest = args[:i] + args[i + take:]
        path, option = _command_option(exc.ctx, rest, flag)
        if option is None or (take == 2) == option.is_flag:
            continue
        at = _first_word(rest) + len(path)
        fixed = rest[:at] + args[i:i + take] + rest[at:]
        return (f"{flag} is an option of `fdl {' '.join(path)}`, not a global option of fdl: it goes after the "
                f"command name. Write: {line(fixed)}")
    return None


def _command_option(ctx: Any, words: list[str], flag: str) -> tuple[list[str], Any]:
    """(the command path `words` names, e.g. ["libtorch", "list"], and its option `flag`, or None)."""
    if ctx is None:
        return [], None
    command: Any = ctx.command
    path: list[str] = []
    for word in words[_first_word(words):]:
        if not isinstance(command, click.Group) or word.startswith("-"):
            break
        try:
            sub = command.get_command(ctx, word)
        except FdlError:  # a project command list that does not load: nothing to say about it here
            sub = None
        if sub is None:
            break
        command, path = sub, [*path, word]
    if not path:
        return [], None
    option = next((p for p in command.params if isinstance(p, click.Option) and flag in (*p.opts, *p.secondary_opts)),
                  None)
    return path, option


def argument_help(command: Any) -> Any:
    """Make the help of `command` and its subcommands read the same under every supported typer/click pairing.

    Each positional argument gets the help text of its typer.Argument (some pairings lose it: typer sets
    `help`, then click's Argument constructor resets it, which leaves `--help` listing arguments with no
    description), and is listed once: typer lists arguments under "Arguments:" beside the options, and
    click 8.2 and later would list them again under "Positional arguments:".
    """
    import inspect
    import typing

    for sub in getattr(command, "commands", {}).values():
        argument_help(sub)
    if isinstance(command, (TyperCommand, TyperGroup)):
        command.format_arguments = _listed_with_the_options  # type: ignore[method-assign]
    callback = getattr(command, "callback", None)
    if callback is None:
        return command
    try:
        hints = typing.get_type_hints(inspect.unwrap(callback), include_extras=True)
    except Exception:
        return command
    for param in command.params:
        if param.param_type_name != "argument" or getattr(param, "help", None):
            continue
        for meta in getattr(hints.get(param.name), "__metadata__", ()):
            if isinstance(meta, typer.models.ArgumentInfo) and meta.help:
                param.help = meta.help
    return command


def _listed_with_the_options(ctx: Any, formatter: Any) -> None:
    """click's own arguments section, left out: typer's format_options already lists the arguments."""


class FdlGroup(TyperGroup):
    """The root group: built-in commands load lazily; fdl.yml `commands:` are found by name."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = list(BUILTINS)
        for name in self._user_commands(ctx):
            if name not in names:
                names.append(name)
        return names

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in BUILTINS:
            module = importlib.import_module(BUILTINS[cmd_name][0])
            command = typer.main.get_command(module.app)
            command.name = cmd_name
            return refuse_contradictions(argument_help(command), cmd_name)
        spec = self._user_commands(ctx).get(cmd_name)
        if spec is not None:
            from fdl.cli.usercmd import make_command

            return refuse_contradictions(argument_help(make_command(spec)), cmd_name)
        return None

    def _user_commands(self, ctx: Any) -> dict[str, CommandSpec]:
        if ctx is None or not isinstance(ctx.obj, (Globals, Invocation)):
            return {}
        return ensure_globals(ctx).user_commands()

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError:
            name = args[0] if args else ""
            try:
                known = self.list_commands(ctx)
            except FdlError:
                known = list(BUILTINS)
            import difflib

            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            if not close or name in known:
                raise
            guesses = " or ".join(f"'{c}'" for c in close)
            raise click.UsageError(f"No such command '{name}'. Did you mean {guesses}?", ctx) from None

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, help_) for name, (_, help_) in BUILTINS.items()]
        broken = None
        try:
            user = self._user_commands(ctx)
        except FdlError as exc:
            user = {}
            broken = exc.message
        rows_user = [(name, spec.description or (spec.run if spec.run else f"cluster run of {spec.bin}"))
                     for name, spec in user.items() if name not in BUILTINS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
        if rows_user:
            with formatter.section("Project commands (fdl.yml)"):
                formatter.write_dl(rows_user)
        elif broken is not None:
            with formatter.section("Project commands (fdl.yml)"):
                formatter.write_text(f"not listed: the configuration does not load: {broken}")
                formatter.write_text("(`fdl config show` shows the same error.)")


app = typer.Typer(
    cls=FdlGroup,
    name="fdl",
    help="Cluster and hardware command line of flodl: probe hosts, run and watch cluster training.\n\n"
         f"Select an env overlay, strongest first, with --env NAME, @NAME as the first word (fdl @cluster "
         f"probe), or {FDL_ENV}.",
    rich_markup_mode=None,
    add_completion=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fdl {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    ctx: typer.Context,
    env: Annotated[str | None, typer.Option("--env", help="Env overlay to apply: fdl.NAME.yml over fdl.yml.",
                                            metavar="NAME")] = None,
    gpus: Annotated[list[str] | None, typer.Option("--gpus", help="GPUs for this command, given once: 'all' or ids "
                                                   "like 0,1.", metavar="all|IDS")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug notes.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Say more on stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    ensure_globals(ctx).apply_gpus()


def ensure_globals(ctx: Any) -> Globals:
    """The invocation's Globals, built from the root options the first time it is asked for.

    Click resolves the subcommand (which may be a project command found in
    fdl.yml under the selected env) before it runs the root callback, so both
    paths come here.
    """
    root_ctx = ctx.find_root()
    if isinstance(root_ctx.obj, Globals):
        return root_ctx.obj
    invocation: Invocation = root_ctx.obj if isinstance(root_ctx.obj, Invocation) else Invocation()
    params = root_ctx.params
    gpus = tuple(params.get("gpus") or ())  # --gpus is declared repeatable so that a second one is seen, and refused
    root_ctx.obj = Globals(invocation=invocation, env_flag=params.get("env"), gpus_spec=gpus[-1] if gpus else None,
                           debug=bool(params.get("debug")) or invocation.debug,
                           verbose=bool(params.get("verbose")), gpus_given=gpus)
    made: Globals = root_ctx.obj
    return made


def report_error(exc: FdlError, debug: bool) -> None:
    """An error for the person at the terminal, on stderr: the configuration's warnings first (they often
    explain the error), then every error found, one line each, then the hint."""
    if debug:
        import traceback

        traceback.print_exception(exc)
    lines = [f"fdl: warning: {warning}" for warning in getattr(exc, "warnings", ())]
    for error in getattr(exc, "errors", None) or [exc.message]:
        lines.append(f"fdl: {exc.label}: {error}" if exc.label else f"fdl: {error}")
    if exc.hint:
        lines[-1] += f"\n  hint: {exc.hint}"
    print(strip_userinfo("\n".join(lines)), file=sys.stderr)  # no URL's password, whichever message echoed it


def failure_document(exc: BaseException | None, exit_code: int, message: str | None = None) -> dict[str, Any]:
    """The --json twin of a failure: `{"ok": false, "reason": CODE, "message": SENTENCE, ...}`, the envelope
    the controller's own refusals use. reason is the most specific kind of error known: the error's own code
    (a controller's refusal), else that of the error it re-words, else its class in snake_case."""
    hint = getattr(exc, "hint", None)
    doc: dict[str, Any] = {"ok": False, "reason": failure_reason(exc), "message": strip_userinfo(message or str(exc)),
                           "hint": strip_userinfo(hint) if isinstance(hint, str) else hint, "exit_code": int(exit_code)}
    if isinstance(exc, FdlError) and len(getattr(exc, "errors", ())) > 1:
        doc["errors"] = [strip_userinfo(str(error)) for error in getattr(exc, "errors", ())]
    if getattr(exc, "warnings", None):
        doc["warnings"] = [strip_userinfo(str(warning)) for warning in getattr(exc, "warnings", ())]
    return doc


def failure_reason(exc: BaseException | None) -> str:
    import re

    if exc is None:
        return "failed"
    own = getattr(exc, "reason", None)
    if isinstance(own, str) and own:
        return own
    if isinstance(exc, click.exceptions.ClickException):
        return "usage_error"
    if isinstance(exc, (KeyboardInterrupt, typer.Abort)):
        return "interrupted"
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, FdlError) and isinstance(cause, FdlError):
        return failure_reason(cause)
    if not isinstance(exc, FdlError):
        return "internal_error"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", type(exc).__name__).lower()


class WatchedStdout:
    """sys.stdout while a command runs with --json: notes whether the command wrote anything, so the
    boundary adds a failure's document only where the command printed no document of its own."""

    def __init__(self, stream: Any, seen: list[bool] | None = None):
        self._stream = stream
        self._seen = [False] if seen is None else seen

    @property
    def written(self) -> bool:
        return self._seen[0]

    def write(self, text: Any) -> Any:
        if text:
            self._seen[0] = True
        return self._stream.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    @property
    def buffer(self) -> WatchedStdout:
        return WatchedStdout(self._stream.buffer, self._seen)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    """Run fdl with argv (default sys.argv[1:]) and return the exit code.

    With --json, a built-in command's outcome is one JSON document on stdout whatever happens: its own
    report, or, when it failed before printing one, failure_document().
    """
    args = list(sys.argv[1:] if argv is None else argv)
    args, sigil = split_sigil(args)
    head = args[: args.index("--")] if "--" in args else args
    debug = "--debug" in head or read(FDL_DEBUG) == "1"
    invocation = Invocation(sigil=sigil, debug=debug)
    if not wants_json(args):
        return _run(args, invocation, debug)[0]
    real = sys.stdout
    watched = sys.stdout = WatchedStdout(real)
    try:
        code, failure = _run(args, invocation, debug)
    finally:
        if sys.stdout is watched:
            sys.stdout = real
    if code != 0 and not watched.written and sys.stdout is real:
        if failure is None and code == ExitCode.INTERRUPTED:  # typer turns Ctrl-C into a return of 130
            failure = failure_document(KeyboardInterrupt(), code, "interrupted")
        elif failure is None:
            failure = failure_document(None, code, f"the command ended with exit code {code} and no report")
        import json

        print(json.dumps(failure, indent=2), flush=True)
    return code


def _run(args: list[str], invocation: Invocation, debug: bool) -> tuple[int, dict[str, Any] | None]:
    """(exit code, the failure's JSON document or None): the one place errors become messages and codes."""
    try:
        command = typer.main.get_command(app)
        result = command.main(args=args, prog_name="fdl", standalone_mode=False, obj=invocation)
        return (int(result or 0) if isinstance(result, int) else 0), None
    except FdlError as exc:
        report_error(exc, debug)
        return int(exc.exit_code), failure_document(exc, exc.exit_code)
    except typer.Exit as exc:
        return int(getattr(exc, "exit_code", 0) or 0), None
    except click.exceptions.NoSuchOption as exc:
        moved = misplaced_option(exc, args, invocation.sigil)
        shown = click.UsageError(moved, exc.ctx) if moved is not None else exc
        shown.show()
        return ExitCode.PERMANENT, failure_document(shown, ExitCode.PERMANENT, shown.format_message())
    except click.exceptions.ClickException as exc:
        exc.show()
        return ExitCode.PERMANENT, failure_document(exc, ExitCode.PERMANENT, exc.format_message())
    except (KeyboardInterrupt, typer.Abort) as exc:
        print("fdl: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED, failure_document(exc, ExitCode.INTERRUPTED, "interrupted")
    except BrokenPipeError:
        # stdout closed early (fdl ... | head): not an error worth a traceback
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the interpreter's flush at exit
        except OSError:
            pass
        return ExitCode.FAILURE, None
    except Exception as exc:  # the last line of defence: never a traceback unless asked
        if debug:
            import traceback

            traceback.print_exc()
        message = (f"internal error: {type(exc).__name__}: {exc}. This is a bug in fdl; rerun with --debug "
                   f"for the traceback and report it.")
        print(f"fdl: {message}", file=sys.stderr)
        return ExitCode.FAILURE, failure_document(exc, ExitCode.FAILURE, message)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
