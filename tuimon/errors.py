"""Errors a user can act on: the CLI prints them as one line, never as a traceback."""


class UserError(Exception):
    """A problem the user can fix: the message names it and says what to do."""
