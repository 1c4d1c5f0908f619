"""Exceptions reported as one line, without a traceback: `UserError` (exit 2, the user can fix it) and
`RunFailed` (exit 1: a recorded reason, a full disk). Anything else is a bug."""

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class RunFailed(UserError):
    """A run that failed for a recorded reason (exit status 1, not 2)."""


class DiskFull(RunFailed):
    """The disk filled up (ENOSPC): what was written stays whole, the same command resumes later."""


EXIT_USAGE = 2  # a UserError: the input needs fixing
EXIT_FAILED = 1  # a RunFailed: the run failed for a recorded reason
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM; the same command resumes


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'X'?)' with the closest of `choices`, for a UserError's line ('' if none)."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def exit_status(err: UserError) -> int:
    """The exit status a command reports for `err`."""
    return EXIT_FAILED if isinstance(err, RunFailed) else EXIT_USAGE
