"""User-facing errors: printed as one readable message by the `hir` command, no traceback."""


class HirError(Exception):
    """A problem the user can fix (bad input file, bad config). The message names what was
    found, where (file, column, row) and the fix."""


class InputError(HirError):
    """A structural problem with an input file: missing column, unreadable or empty file."""


class OutputError(HirError, ValueError):
    """An earlier stage's output that this hir cannot use (missing, written by another version,
    or changed since it was written): the message names the file and the command that rewrites
    it. A ValueError too, for callers that caught the plain one."""


class OutputVersionError(OutputError, RuntimeError):
    """An output saved by another version of a library hir loads it with (refit it)."""
