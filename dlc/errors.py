"""The one exception type for mistakes a user can fix."""


class UserError(Exception):
    """Bad input: a recipe value, a missing file, an unreadable checkpoint.

    The message says what is wrong and how to fix it. The CLI prints it without a
    traceback and exits with code 2; nothing else catches it.
    """
