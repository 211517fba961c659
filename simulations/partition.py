"""Split one labelled dataset across simulated sites: ``iid``, ``dirichlet`` or ``shards``
(``auto``, the default, is ``iid`` here; a task that generates its own sites, such as
``synthetic-1-1``, is split by ``fedweave.simulations.split`` instead).

The skewed partitions are flwr-datasets' (DirichletPartitioner, PathologicalPartitioner);
this module only adapts our in-memory labels to the Hugging Face ``Dataset`` those partitioners
expect and returns index arrays. They need the simulation extra (``fedweave[simulation]``);
``iid`` needs none: it is a seeded shuffle cut into contiguous blocks, exactly what
flwr-datasets' IidPartitioner cuts (tests/test_light_install.py checks they agree), so a light
install can still split data for a pilot. Seeded and deterministic.
"""

from __future__ import annotations

import numpy as np

from fedweave.errors import UserError

PARTITION_SCHEMES = ("auto", "iid", "dirichlet", "shards")


def _make_partitioner(
    scheme: str, num_clients: int, alpha: float, shards_per_client: int, seed: int
):  # -> flwr_datasets.partitioner.Partitioner
    from flwr_datasets.partitioner import DirichletPartitioner, PathologicalPartitioner

    if scheme == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_clients,
            partition_by="label",
            alpha=alpha,
            min_partition_size=2,
            self_balancing=False,
            shuffle=True,
            seed=seed,
        )
    return PathologicalPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        num_classes_per_partition=shards_per_client,
        class_assignment_mode="first-deterministic",
        shuffle=True,
        seed=seed,
    )


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    scheme: str = "iid",
    alpha: float = 0.5,
    shards_per_client: int = 2,
    seed: int = 0,
) -> list[np.ndarray]:
    """Indices into ``labels`` for each of ``num_clients`` sites.

    Args:
        labels: integer class label per example.
        num_clients: number of sites (>= 1, at most one per example).
        scheme: ``iid`` or ``auto`` (uniform shuffle), ``dirichlet`` (per-class proportions
            drawn from Dir(alpha): smaller alpha, more skew) or ``shards`` (pathological: each
            site holds ``shards_per_client`` classes).
        alpha: Dirichlet concentration, > 0 (default 0.5); only for ``dirichlet``.
        shards_per_client: classes per site for ``shards`` (default 2).
        seed: same seed, same split (default 0).
    """
    if scheme not in PARTITION_SCHEMES:
        raise UserError(f"unknown partition '{scheme}': use one of {', '.join(PARTITION_SCHEMES)}")
    if num_clients < 1:
        raise UserError(f"--clients must be at least 1, got {num_clients}")
    if num_clients > len(labels):
        raise UserError(
            f"--clients {num_clients} is more than the {len(labels)} training examples; "
            "use fewer clients"
        )
    if scheme == "dirichlet" and not alpha > 0:
        raise UserError(f"--alpha must be > 0 for the dirichlet partition, got {alpha}")
    num_classes = len(np.unique(labels))
    if scheme == "shards" and not 1 <= shards_per_client <= num_classes:
        raise UserError(f"--shards-per-client must be between 1 and {num_classes}")

    if scheme in ("auto", "iid"):
        # IidPartitioner's contiguous blocks (Dataset.shard(contiguous=True)) of a seeded
        # shuffle: the first len % n sites hold one example more
        order = np.random.default_rng(seed).permutation(len(labels))
        return [order[block] for block in np.array_split(np.arange(len(labels)), num_clients)]
    from fedweave.extras import require

    require("simulation", f"--partition {scheme}", ("flwr_datasets", "datasets"))
    import datasets

    datasets.disable_progress_bars()
    table = datasets.Dataset.from_dict(
        {"label": np.asarray(labels).tolist(), "index": list(range(len(labels)))}
    )
    partitioner = _make_partitioner(scheme, num_clients, alpha, shards_per_client, seed)
    partitioner.dataset = table
    try:
        parts = [
            np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64)
            for i in range(num_clients)
        ]
    except ValueError as exc:
        raise UserError(
            f"cannot split {len(labels)} examples into {num_clients} '{scheme}' sites "
            f"({exc}); use fewer clients or a larger --alpha"
        ) from exc
    return parts


def label_skew(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean total-variation distance between each site's label mix and the global mix.

    0 means every site looks like the whole dataset; values near 1 mean sites hold
    disjoint classes. Used to show Dirichlet skew grows as alpha falls.
    """
    classes = np.unique(labels)
    overall = np.array([(labels == c).mean() for c in classes])
    distances = []
    for part in parts:
        if len(part) == 0:
            continue
        site = np.array([(labels[part] == c).mean() for c in classes])
        distances.append(0.5 * np.abs(site - overall).sum())
    return float(np.mean(distances))
