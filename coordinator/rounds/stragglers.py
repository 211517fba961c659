"""Simulated systems heterogeneity: stragglers, as in the FedProx paper (Li et al., MLSys 2020).

Each round a share of the sampled sites are stragglers: they finish only a uniformly random
part of their local work by the deadline. FedProx aggregates that partial work; FedAvg (and
every other strategy here) has no use for it and drops those sites, as the paper's FedAvg does.
The site does the (partial) work, or answers ``late`` when it would be dropped; so the sampled
cohort, SecAgg+ included, is exactly the one the wrapped strategy chose.
"""

from __future__ import annotations

import numpy as np
from flwr.common import FitIns, Parameters
from flwr.server import ClientManager
from flwr.server.strategy import Strategy

from fedweave.contract import DROPS_PARTIAL_WORK_KEY, WORK_FRACTION_KEY
from fedweave.flower_patches.default_workflow import ClientProxy
from fedweave.learning.site_speeds import MIN_WORK_FRACTION


def pick_stragglers(
    count: int, fraction: float, seed: int, server_round: int
) -> dict[int, float]:
    """Positions among ``count`` sampled sites that straggle this round → the share of their
    work each finishes, uniform in [``MIN_WORK_FRACTION``, 1); the same for the same seed and
    round. ``round(fraction * count)`` sites straggle."""
    rng = np.random.default_rng([seed, server_round])
    chosen = rng.choice(count, size=int(round(fraction * count)), replace=False)
    return {int(i): float(rng.uniform(MIN_WORK_FRACTION, 1.0)) for i in sorted(chosen)}


class StragglerStrategy(Strategy):
    """Marks a share of each round's sampled sites as stragglers; otherwise ``strategy``.

    Parameters
    ----------
    strategy : Strategy
        The Flower strategy that samples and aggregates.
    fraction : float
        Share of each round's sampled sites that straggle, in [0, 1).
    seed : int
        The run's seed; with the round number it fixes who straggles and how much.
    partial_work_counts : bool
        True for FedProx (stragglers send what they did); False drops them as ``late``.
    round_offset : int (default: 0)
        Rounds done before this process (resume), so resumed rounds draw as the originals.
    """

    def __init__(
        self,
        strategy: Strategy,
        fraction: float,
        seed: int,
        partial_work_counts: bool,
        round_offset: int = 0,
    ) -> None:
        super().__init__()
        self.strategy = strategy
        self.fraction = fraction
        self.seed = seed
        self.partial_work_counts = partial_work_counts
        self.round_offset = round_offset

    def __repr__(self) -> str:
        return f"StragglerStrategy({self.strategy!r}, fraction={self.fraction:g})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.strategy.initialize_parameters(client_manager)

    def num_fit_clients(self, num_available_clients: int) -> tuple[int, int]:
        """The wrapped strategy's (sample size, minimum) for ``num_available_clients``: the
        round's sampled count the history notes before sampling."""
        return self.strategy.num_fit_clients(num_available_clients)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        instructions = sorted(instructions, key=lambda item: item[0].node_id)
        stragglers = pick_stragglers(
            len(instructions), self.fraction, self.seed, server_round + self.round_offset
        )
        marked = []
        for index, (proxy, ins) in enumerate(instructions):
            if index in stragglers:
                config = dict(ins.config)
                config[WORK_FRACTION_KEY] = stragglers[index]
                config[DROPS_PARTIAL_WORK_KEY] = not self.partial_work_counts
                ins = FitIns(ins.parameters, config)
            marked.append((proxy, ins))
        return marked

    def aggregate_fit(self, server_round, results, failures):
        return self.strategy.aggregate_fit(server_round, results, failures)

    def configure_evaluate(self, server_round, parameters, client_manager):
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round, results, failures):
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(self, server_round, parameters):
        return self.strategy.evaluate(server_round, parameters)
