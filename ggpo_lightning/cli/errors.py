"""One error-reporting path for user mistakes: ``ggpo-train`` and ``ggpo`` print the message of the project's
own error types on one line, without a traceback, and exit 2; any other exception is a bug and keeps its
traceback. ``--debug`` (or ``GGPO_DEBUG=1``) shows the traceback of a user error too."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

from ggpo_verifiers import GoldAnswerError, UnknownVerifierError

from ggpo_lightning.records.errors import UserError

__all__ = ["DEBUG_ENV", "USER_ERRORS", "USER_ERROR_EXIT", "debug_requested", "report_user_errors"]

T = TypeVar("T")

USER_ERRORS: tuple[type[BaseException], ...] = (UserError, GoldAnswerError, UnknownVerifierError)
"""What a user can fix: the trainer's settings, data, checkpoint and resume errors (and a second run into one
directory, a full disk), and the verifiers' unknown-name and unparsable-gold errors."""

USER_ERROR_EXIT = 2
DEBUG_ENV = "GGPO_DEBUG"


def debug_requested(args: list[str]) -> tuple[bool, list[str]]:
    """``(debug, args without --debug)``: debug when ``--debug`` is among ``args`` or ``GGPO_DEBUG`` is set to a
    value other than ``""``/``0``."""
    rest = [a for a in args if a != "--debug"]
    return len(rest) != len(args) or os.environ.get(DEBUG_ENV, "0") not in ("", "0"), rest


def report_user_errors(program: str, run: Callable[[], T], debug: bool) -> T:
    """``run()``; a user error (:data:`USER_ERRORS`) becomes ``PROGRAM: error: MESSAGE`` and the ``--debug``
    hint on stderr and exit status 2, unless ``debug`` (then it propagates with its traceback)."""
    try:
        return run()
    except USER_ERRORS as error:
        if debug:
            raise
        print(f"{program}: error: {error}", file=sys.stderr, flush=True)
        print(f"(a mistake in the input, not a bug; run with --debug or {DEBUG_ENV}=1 for the traceback)",
              file=sys.stderr, flush=True)
        sys.exit(USER_ERROR_EXIT)
