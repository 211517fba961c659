"""``python -m fedweave.flower_patches.launch COMMAND ARGS``: one of Flower's commands with the
patches for its process applied first. ``COMMAND`` and ``ARGS`` are exactly Flower's;
``fedweave coordinator`` starts ``flower-superlink`` this way and ``fedweave client``
``flower-supernode``, so an operator never runs it by hand.

- ``flower-superlink``: ``close_control_surface`` (administrative APIs for this machine only,
  fedweave's bundles only, AEAD TLS) and ``let_sites_rejoin_at_once`` (a restarted site takes
  its node back), and the speed-up ``tune_superlink_middleware`` (a request skips the
  middleware layers that would pass it through untouched);
- ``flower-supernode``: ``bound_supernode_waits`` (a reply wait that ends, capped sleeps) and
  ``report_supernode_state`` (connected, refused, retrying, a run ended: JSON lines to the
  file ``fedweave client`` names in ``FEDWEAVE_SUPERNODE_STATE_FILE``), and, where the site's
  ClientApps run in fedweave's worker (``--isolation process``), the speed-up
  ``quick_task_expiry`` (a dead worker's message answered as failed within about 20 s).

A patch that cannot be applied (another Flower version) ends the command with one line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def _superlink() -> Callable[[], None]:
    from flwr.superlink.cli import flower_superlink

    from fedweave.errors import UserError
    from fedweave.flower_patches import (
        close_control_surface,
        let_sites_rejoin_at_once,
        tune_superlink_middleware,
    )

    try:
        close_control_surface()
        let_sites_rejoin_at_once()
    except UserError as exc:
        raise SystemExit(f"fedweave: {exc}") from None
    tune_superlink_middleware()
    return flower_superlink


def _supernode() -> Callable[[], None]:
    from flwr.supernode.cli.flower_supernode import flower_supernode

    from fedweave.errors import UserError
    from fedweave.flower_patches import (
        bound_supernode_waits,
        quick_task_expiry,
        report_supernode_state,
    )

    try:
        bound_supernode_waits()
        report_supernode_state()
    except UserError as exc:
        raise SystemExit(f"fedweave: {exc}") from None
    if _runs_external_worker(sys.argv[2:]):  # whose heartbeat beats often (task_expiry)
        quick_task_expiry()
    return flower_supernode


def _runs_external_worker(args: list[str]) -> bool:
    """Whether Flower's SuperNode ``args`` (ours: ``client/cli.py``'s ``supernode_command``)
    leave its ClientApps to an outside process, fedweave's worker."""
    return any(
        (arg == "--isolation" and args[i + 1 : i + 2] == ["process"])
        or arg == "--isolation=process"
        for i, arg in enumerate(args)
    )


COMMANDS: dict[str, Callable[[], Callable[[], None]]] = {
    "flower-superlink": _superlink,
    "flower-supernode": _supernode,
}
"""Flower command → a function that applies its process's patches and returns its entry point."""


def command(name: str) -> list[str]:
    """The argv prefix that runs Flower's ``name`` with fedweave's patches."""
    if name not in COMMANDS:
        raise ValueError(f"no patched launcher for {name}")
    return [sys.executable, "-m", "fedweave.flower_patches.launch", name]


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        raise SystemExit(
            f"usage: python -m fedweave.flower_patches.launch {{{','.join(COMMANDS)}}} ARGS"
        )
    name = sys.argv[1]
    entry = COMMANDS[name]()
    sys.argv = [name, *sys.argv[2:]]
    entry()


if __name__ == "__main__":
    main()
