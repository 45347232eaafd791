"""The two exceptions the CLI turns into one line on stderr and an exit code."""


class KrexError(Exception):
    """Something krex could not do; the message is one sentence for the user."""


class KrexCommandError(KrexError):
    """A user-facing failure with a specific exit code (2: bad usage/config, 3: no controller...)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
