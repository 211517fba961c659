"""``python -m fedweave.gossip ...``: the ``fedweave peer`` command without the top-level CLI.

Simulations and tests launch peers this way so they do not depend on the full ``fedweave``
CLI; user errors print one line and exit 2, like ``fedweave``.
"""

from __future__ import annotations

import sys

import typer


def main(argv: list[str] | None = None) -> int:
    from fedweave.errors import USER_ERROR_EXIT_CODE, UserError
    from fedweave.gossip.cli import keys_app, peer

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command("peer")(peer)
    app.add_typer(keys_app, name="keys")
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("peer", "keys", "--help"):
        args = ["peer", *args]
    try:
        result = app(args, standalone_mode=False)  # click returns Exit codes here
        if isinstance(result, int):
            return result
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except typer.Exit as exc:
        return int(exc.exit_code)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
