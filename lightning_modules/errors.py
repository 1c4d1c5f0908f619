"""The one exception type for mistakes a user can fix (bad config, bad corpus, bad path).

The CLI prints it as a single line and exits with status 2; anything else is a bug.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
