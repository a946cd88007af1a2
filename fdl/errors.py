"""The one error hierarchy of fdl.

Library code raises these; only the command boundary (`fdl.cli.main`) prints
them and exits with their code. Messages are written for the person at the
terminal: what was wrong, where, and what to do about it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes shared by every command."""

    OK = 0
    FAILURE = 1  # a retry or a fix elsewhere can mend it
    PERMANENT = 2  # retrying cannot fix it (also: a command line that does not parse)
    INTERRUPTED = 130


class FdlError(Exception):
    """Base of every error fdl reports to a user."""

    exit_code: int = ExitCode.FAILURE
    #: the word the boundary puts after "fdl:" (None: the message stands alone, see Outcome)
    label: str | None = "error"

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = int(exit_code)

    def __str__(self) -> str:
        return self.message


class ConfigError(FdlError):
    """A configuration file is missing, unreadable, malformed or invalid."""

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None,
                 errors: list[str] | None = None, warnings: list[str] | None = None):
        super().__init__(message, hint=hint, exit_code=exit_code)
        #: every error found before validation stopped (the boundary prints one line each)
        self.errors = list(errors) if errors else [message]
        #: the warnings of the same files (unknown keys, did-you-mean), printed before the errors
        self.warnings = list(warnings or ())

    @classmethod
    def collected(cls, errors: list[str], warnings: list[str]) -> ConfigError:
        """One error standing for all the errors validation found in the configuration."""
        if len(errors) == 1:
            return cls(errors[0], warnings=warnings)
        return cls(f"{len(errors)} errors in the configuration: " + " ".join(errors), errors=errors,
                   warnings=warnings)


class UsageError(FdlError):
    """The command line is malformed or contradictory."""

    exit_code = ExitCode.PERMANENT


class PermanentError(FdlError):
    """A failure that retrying cannot fix."""

    exit_code = ExitCode.PERMANENT


class BuildError(FdlError):
    """The training program did not build, or the build left no runnable binary (mended at the source)."""


class RemoteError(FdlError):
    """A remote host or endpoint failed or could not be reached."""


class Outcome(FdlError):
    """A documented answer of no that is nobody's fault (no run listening, a start refused): exit 1, no "error:"."""

    label = None
