"""Write a task's data as per-site files plus a held-out test file, for simulations and pilots."""

from __future__ import annotations

from pathlib import Path

from fedweave.errors import UserError
from fedweave.learning.data import save_site_npz
from fedweave.learning.task import Task
from fedweave.simulations.partition import partition_indices


def site_file(out_dir: Path, index: int) -> Path:
    return out_dir / f"site-{index}.npz"


def test_file(out_dir: Path) -> Path:
    return out_dir / "test.npz"


def write_split(
    task: Task,
    out_dir: Path,
    num_clients: int,
    partition: str = "iid",
    alpha: float = 0.5,
    shards_per_client: int = 2,
    seed: int = 0,
) -> list[Path]:
    """Partition the task's training pool into ``site-<i>.npz`` files and ``test.npz``.

    Returns the site file paths in site order.
    """
    train, test = task.load_data()
    parts = partition_indices(train.y, num_clients, partition, alpha, shards_per_client, seed)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for index, part in enumerate(parts):
            paths.append(site_file(out_dir, index))
            save_site_npz(paths[-1], train.subset(part))
        save_site_npz(test_file(out_dir), test)
    except OSError as exc:
        raise UserError(
            f"cannot write the split to {out_dir} ({exc.strerror}); choose a writable --out"
        ) from exc
    return paths
