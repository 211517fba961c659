"""User-caused failures: reported as one line with the fix, exit code 2, never a traceback."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """A failure the user can fix (bad flag, bad file, unreachable DB or peer).

    The message must name the problem and the fix in one line; the CLI prints it as
    ``error: <message>`` and exits with code 2.
    """


def mask_url_password(url: str) -> str:
    """Hide the password of a database URL so it can be printed: ``user:***@host``."""
    return re.sub(r"(?<=://)([^:/@]+):([^@]*)@", r"\1:***@", url)


@contextmanager
def user_errors_as_one_line() -> Iterator[None]:
    """Around a command: a ``UserError`` becomes ``error: <message>`` on stderr and exit 2."""
    import click

    try:
        yield
    except UserError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(USER_ERROR_EXIT_CODE) from None
