"""``fedweave coordinator``: the server side of a real deployment (Flower SuperLink + our
ServerApp). Its options are declared in ``fedweave/config/sections.py``, shared with
``fedweave simulate`` (same names, same defaults); mounted in ``fedweave/cli.py``.

Only Typer and the config are imported at module level, so ``fedweave --help`` does not load
Flower or torch.
"""

from __future__ import annotations

import typer

from fedweave.config import Resolved, RunConfig, config_command


def _coordinator(config: RunConfig, resolved: Resolved) -> None:
    from fedweave.coordinator.serve import serve

    raise typer.Exit(serve(config, resolved))


coordinator = config_command(
    "coordinator",
    _coordinator,
    """Run the coordinator: a Flower SuperLink sites connect to, and our ServerApp on top.

    Example:

        fedweave coordinator --tls-dir tls --min-clients 3 --rounds 20 --strategy fedavg
    """,
)
