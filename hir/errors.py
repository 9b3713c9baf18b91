"""User-facing errors: printed as one readable message by the `hir` command, no traceback."""


class HirError(Exception):
    """A problem the user can fix (bad input file, bad config). The message names what was
    found, where (file, column, row) and the fix."""


class InputError(HirError):
    """A structural problem with an input file: missing column, unreadable or empty file."""
