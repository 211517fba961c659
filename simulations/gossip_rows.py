"""The per-round rows of a gossip simulation report, from the peers' events and model dumps.

Each row averages over the peers that completed that round: ``accuracy`` is the mean test
accuracy of the peers' own models (the issue's contract), ``consensus_distance`` the mean L2
distance of their models to their mean, and ``network_accuracy`` the test accuracy of that
mean model: what the network as a whole has learned. The gap between the two accuracies is
what the peers' disagreement costs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.gossip.averaging import consensus_distance


class MeanModelScorer:
    """Test accuracy of a flattened model (``fedweave.gossip.averaging.flatten`` order) on ``test``.

    Args:
        task: the task the peers train (``adapters.run_task``: adapted in a ``--peft lora``
            run, whose dumps are the adapters).
        test_path: the held-out file the peers evaluate on.
    """

    def __init__(self, task: Any, test_path: Path) -> None:
        from fedweave.learning.data import load_site_data
        from fedweave.learning.training import TrainConfig

        self.task = task
        self.test = load_site_data(test_path, self.task)
        self.model = self.task.build_model()
        self.config = TrainConfig(device="cpu")

    def __call__(self, flat: np.ndarray) -> float:
        import torch

        state = self.model.state_dict()
        offset = 0
        for key, tensor in state.items():
            if not tensor.is_floating_point():
                continue
            size = tensor.numel()
            chunk = flat[offset : offset + size].reshape(tuple(tensor.shape))
            state[key] = torch.from_numpy(chunk).to(tensor.dtype)
            offset += size
        if offset != flat.size:
            raise ValueError(f"model dump has {flat.size} values, the task's model {offset}")
        self.model.load_state_dict(state)
        return float(self.task.evaluate(self.model, self.test, self.config)["accuracy"])


def round_rows(
    events: Mapping[int, Mapping[int, dict[str, Any]]],
    dumps: Mapping[int, Path],
    rounds: int,
    score_mean: Callable[[np.ndarray], float] | None = None,
) -> list[dict[str, Any]]:
    """One row per round that any peer completed.

    Args:
        events: per peer index, its ``round`` events by round number.
        dumps: per peer index, the folder of its ``round-<r>.npy`` model dumps.
        rounds: the last round to report.
        score_mean: accuracy of the peers' mean model (``MeanModelScorer``); ``None``: the
            rows get no ``network_accuracy``.
    """
    rows = []
    for r in range(1, rounds + 1):
        done = [i for i in events if r in events[i]]
        if not done:
            continue
        round_events = [events[i][r] for i in done]
        accs = [e["accuracy"] for e in round_events if e.get("accuracy") is not None]
        losses = [e["loss"] for e in round_events if e.get("loss") is not None]
        vectors = [
            np.load(dumps[i] / f"round-{r}.npy", allow_pickle=False).astype(np.float64)
            for i in done
            if (dumps[i] / f"round-{r}.npy").exists()
        ]
        row: dict[str, Any] = {
            "round": r,
            "accuracy": float(np.mean(accs)) if accs else None,
            "loss": float(np.mean(losses)) if losses else None,
            "seconds": float(np.mean([e["seconds"] for e in round_events])),
            # when the first peer began it and the last finished it (Unix time)
            "began_at": min(float(e["t"]) - float(e["seconds"]) for e in round_events),
            "finished_at": max(float(e["t"]) for e in round_events),
            "consensus_distance": consensus_distance(vectors) if len(vectors) > 1 else 0.0,
            "peers": len(round_events),
            "min_accuracy": float(np.min(accs)) if accs else None,
            "failed_exchanges": int(sum(e.get("failed", 0) for e in round_events)),
        }
        if score_mean is not None and vectors:
            row["network_accuracy"] = score_mean(np.mean(vectors, axis=0))
        rows.append(row)
    return rows
