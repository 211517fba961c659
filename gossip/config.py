"""``PeerConfig``: everything ``fedweave peer`` takes, as one dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PeerConfig:
    """Everything ``fedweave peer`` takes. Defaults in brackets.

    Attributes:
        listen: endpoint to bind, ``tcp://HOST:PORT``.
        seeds: endpoints of peers to join through, ``tcp://A:P`` or ``PEERID@tcp://A:P`` [].
        task / data / test: task name, local data file, optional held-out file to evaluate on.
        rounds: rounds to run; 0 runs until SIGTERM [50].
        db / run_id: history URL (``None``: no history) and an existing run to write into.
        keys: CURVE key directory (``None``: plaintext) [None].
        fanout: neighbours contacted per round [4].
        mix: ``pairwise`` | ``clipped`` | ``trimmed`` [pairwise].
        clip_tau: ClippedGossip radius; ``None`` adapts it (median of recent norms).
        trim_fraction: share trimmed at each end by ``trimmed`` [0.2].
        exchange_timeout: seconds to wait for neighbours' replies each round [5].
        connect_timeout: seconds to keep trying the seeds before giving up [30].
        drop_after: consecutive misses before a neighbour is dropped [3].
        max_message_mb: largest accepted message [1024].
        wait_for_peers: before round 1, wait (≤ connect_timeout) until this many peers,
            self included, are known; simulations use it so nobody races ahead alone [0].
        round_interval: slot length T; rounds start on wall-clock multiples of T, so peers
            with synchronised clocks train together and mix after (``fedweave.gossip.schedule``);
            0 runs rounds back to back [0].
        linger: after the last round, keep answering offers this many seconds [0].
        results / dump_models: JSON-lines results and per-round model dumps (simulations).
        vector / vector_examples: gossip a fixed ``.npy`` vector instead of a task (tests).
    """

    listen: str
    seeds: list[str] = field(default_factory=list)
    task: str = "digits"
    data: Path | None = None
    test: Path | None = None
    rounds: int = 50
    db: str | None = None
    run_id: str | None = None
    keys: Path | None = None
    fanout: int = 4
    mix: str = "pairwise"
    clip_tau: float | None = None
    trim_fraction: float = 0.2
    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    device: str | None = None
    seed: int = 0
    exchange_timeout: float = 5.0
    connect_timeout: float = 30.0
    drop_after: int = 3
    max_message_mb: int = 1024
    wait_for_peers: int = 0
    round_interval: float = 0.0
    linger: float = 0.0
    group_exchange: bool = False
    results: Path | None = None
    dump_models: Path | None = None
    vector: Path | None = None
    vector_examples: int = 1
