"""SecAgg+ for fedweave's tasks: share counts from the cohort, ranges chosen for our weights.

How SecAgg+ treats a site's weights (Flower's ``secaggplus_mod``): they are multiplied by
``num_examples / max_weight``, clipped to ``±clipping_range`` and quantized to
``quantization_range`` levels; the masked integer vectors are summed modulo
``modulus_range``. So ``max_weight`` must be at least the largest site's example count, and
``clipping_range`` must cover the largest ``|weight| * num_examples / max_weight``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedweave.config.cohorts import derive_shares
from fedweave.errors import UserError

if TYPE_CHECKING:
    from fedweave.coordinator.rounds.deadlines import RoundDeadline
    from fedweave.coordinator.rounds.spooled_updates import SpooledUpdates


@dataclass(frozen=True)
class SecAggSettings:
    """SecAgg+ parameters.

    Attributes:
        num_shares: key shares per site (``None``: derived from the cohort, see
            ``fedweave/config/cohorts.derive_shares``, beside the options' rules).
        reconstruction_threshold: shares needed to rebuild a key (``None``: a majority
            of the shares, the smallest value that keeps the server from rebuilding both of a
            live site's secrets).
        timeout: seconds each SecAgg+ stage waits for replies (default 600); a site that has
            not answered by then counts as dropped. Training happens inside a stage, so this
            must exceed a site's local training time.
        clipping_range: ``±`` range after the ``num_examples / max_weight`` scaling (default 8).
        max_weight: largest example count a site may weigh in with (default 10000).
        quantization_range: integer levels over the clipping range (default 2**22).
        modulus_range: mask modulus, a power of two (default 2**32).
    """

    num_shares: int | None = None
    reconstruction_threshold: int | None = None
    timeout: float = 600.0
    clipping_range: float = 8.0
    max_weight: float = 10_000.0
    quantization_range: int = 2**22
    modulus_range: int = 2**32

    def quantization_step(self) -> float:
        """Width of one quantization level in the scaled domain."""
        return 2 * self.clipping_range / self.quantization_range


def make_secagg_workflow(
    settings: SecAggSettings,
    cohort: int,
    deadline: RoundDeadline,
    model_shaped: bool = False,
    held_vectors: SpooledUpdates | None = None,
):
    """Flower's SecAgg+ fit workflow for ``cohort`` sites per round, every round closing
    ``deadline.seconds`` after it starts (``coordinator/rounds/deadlines.py``); with
    ``model_shaped`` (training rounds), the mean is handed to the strategy in the global
    model's shapes and dtypes, not as Flower's flat float64 vector (``secagg_sum``); with
    ``held_vectors`` (``--bulk-address``), the masked vectors stay in the transfer spool until
    the collect stage adds them up (``spooled_updates.py``)."""
    from fedweave.coordinator.rounds.deadlines import DeadlineSecAggPlusWorkflow
    from fedweave.flower_patches import use_fedweave_secagg

    use_fedweave_secagg()

    shares, threshold = derive_shares(cohort)
    shares = settings.num_shares or shares
    threshold = settings.reconstruction_threshold or threshold
    if not 2 <= threshold <= shares <= cohort or (shares < cohort and threshold >= shares):
        raise UserError(
            f"SecAgg+ shares {shares} / threshold {threshold} do not fit {cohort} sites per round: "
            "need 2 <= threshold <= shares <= sites"
        )
    return DeadlineSecAggPlusWorkflow(
        deadline=deadline,
        num_shares=1.0 if shares == cohort else shares,
        reconstruction_threshold=threshold,
        max_weight=settings.max_weight,
        clipping_range=settings.clipping_range,
        quantization_range=settings.quantization_range,
        modulus_range=settings.modulus_range,
        timeout=settings.timeout,
        model_shaped=model_shaped,
        held_vectors=held_vectors,
    )
