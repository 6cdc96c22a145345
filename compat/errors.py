"""Errors meant for the user: the project's one UserError (reid/errors.py, which imports no framework), here
under compat's name for compat's own modules and the code that imports it from here."""
from reid.errors import UserError, _excepthook, install_excepthook  # noqa: F401 (public here)
