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
    from fedweave.coordinator.command.supervisor import serve

    raise typer.Exit(serve(config, resolved))


coordinator = config_command(
    "coordinator",
    _coordinator,
    """Run the coordinator: a Flower SuperLink sites connect to, and our ServerApp on top.

    Example:

        fedweave coordinator --tls-dir tls --min-clients 3 --rounds 20 --strategy fedavg
    """,
)


def _evaluate(config: RunConfig, resolved: Resolved) -> None:
    from fedweave.coordinator.command.supervisor import serve

    raise typer.Exit(serve(config.replace(once=True), resolved))


EVALUATE_HELP = "\n\n".join((
    "Evaluate a recorded federated run at every site: nothing is trained.",
    "Starts a coordinator like `fedweave coordinator` (same address, TLS and site keys), "
    "waits for --min-clients sites, and has every connected site score the run's final "
    "global model ('global') on its own evaluation data and, when the run's --select-metric "
    "picked another round, that round's model ('best-round-N'), in one round trip that "
    "closes after --round-timeout (default 300 s). Task, label column, seed, batch size and "
    "metric come from the evaluated run.",
    "The result is a new history run of one round: the final model's example-weighted "
    "figures, each site's own, and the cross-site matrix (model x site x metric), which "
    "`fedweave history show NEWRUN` prints. The evaluated run is not changed. Exits 0 once "
    "the evaluation is recorded, even if some sites failed (each is recorded with its "
    "reason).",
    "Example:",
    "    fedweave evaluate --run latest --tls-dir tls --min-clients 3",
))  # fmt: skip
"""One paragraph per line: rich help keeps a docstring's line breaks."""

evaluate = config_command("evaluate", _evaluate, EVALUATE_HELP)
