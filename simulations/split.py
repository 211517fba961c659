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
    partition: str = "auto",
    alpha: float = 0.5,
    shards_per_client: int = 2,
    seed: int = 0,
) -> list[Path]:
    """Partition the task's training pool into ``site-<i>.npz`` files and ``test.npz``.

    A task that generates each site's data (``site_data(index, seed)``, the synthetic tasks)
    is written site by site instead, one site in memory at a time; its ``test.npz`` holds
    every site's held-out examples. Returns the site file paths in site order.
    """
    check_split(task, num_clients, partition)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if generates_sites(task):
            return _write_generated_sites(task, out_dir, num_clients, seed)
        train, test = task.load_data()
        parts = partition_indices(train.y, num_clients, partition, alpha, shards_per_client, seed)
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


def generates_sites(task: Task) -> bool:
    """Whether ``task`` generates each site's data (``site_data(index, seed)``: synthetic)."""
    return hasattr(task, "site_data")


def check_split(
    task: Task, num_clients: int, partition: str, pool_size: int | None = None
) -> None:
    """Refuse a split ``task`` cannot serve, before anything is recorded or started.

    Args:
        pool_size: examples in the task's training pool (``len(task.load_data()[0])``);
            None skips that check (a task that generates its sites needs no pool).
    """
    if generates_sites(task):
        if partition != "auto":
            raise UserError(
                f"{task.name} generates each site's own data; --partition {partition} does "
                "not apply to it: leave --partition out (synthetic-iid gives identically "
                "distributed sites)"
            )
        return
    if pool_size is not None and num_clients > pool_size:
        raise UserError(
            f"--clients {num_clients} is more than the {pool_size} training examples of "
            f"'{task.name}'; use fewer clients"
        )


def _write_generated_sites(task: Task, out_dir: Path, num_clients: int, seed: int) -> list[Path]:
    import numpy as np

    from fedweave.learning.task import ArrayData

    paths, tests = [], []
    for index in range(num_clients):
        train, test = task.site_data(index, seed)  # type: ignore[attr-defined]
        paths.append(site_file(out_dir, index))
        save_site_npz(paths[-1], train)
        tests.append(test)
    joined = ArrayData(np.concatenate([t.x for t in tests]), np.concatenate([t.y for t in tests]))
    save_site_npz(test_file(out_dir), joined)
    return paths
