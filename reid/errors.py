"""Errors meant for the user: printed as one line (`error: ...`), exit status 2, no traceback.

Framework-free, so that code which only raises them (the model and loss code, the config, the synthetic data)
imports no framework; `compat.errors` is the same class.
"""
import sys


class UserError(Exception):
    """A problem with the user's input or environment; the message names the problem and the fix."""


def _excepthook(exc_type, exc, tb, _default=sys.excepthook):
    if issubclass(exc_type, UserError):
        sys.stderr.write("error: %s\n" % exc)
        sys.stderr.flush()
        sys.exit(2)
    _default(exc_type, exc, tb)


def install_excepthook():
    """Make an uncaught UserError print one line instead of a traceback (entry points call this)."""
    if sys.excepthook is not _excepthook:
        sys.excepthook = _excepthook


install_excepthook()
