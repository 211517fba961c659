"""A user's own site files as simulated sites: one site per file (or folder) in a directory.

The natural partition: each hospital's file stays one site, read with the same readers and
checks as a deployed site (``fedweave.learning.data.load_site_data``), so a file that a
deployed site would refuse is refused here, before anything starts or is recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedweave.errors import UserError
from fedweave.learning.data import central_test_data, load_site_data

SITE_SUFFIXES = (".csv", ".parquet", ".pq", ".npz")


def site_paths(data_dir: Path) -> list[Path]:
    """The sites in ``data_dir``: its data files and sub-folders (image folders), by name."""
    if not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir} is not a directory; give a folder of site files")
    paths = sorted(
        p
        for p in data_dir.iterdir()
        if not p.name.startswith(".")
        and (p.is_dir() or (p.is_file() and p.suffix.lower() in SITE_SUFFIXES))
    )
    if not paths:
        raise UserError(
            f"--data-dir {data_dir} holds no site files ({', '.join(SITE_SUFFIXES)} or "
            "folders); put one file per site in it"
        )
    return paths


def site_name(path: Path) -> str:
    """A simulated site's name: its file's name without the suffix (``hospital-a.csv``)."""
    return path.stem if path.is_file() else path.name


def check_site_files(
    task: Any, data_dir: Path, test_data: Path | None
) -> tuple[list[Path], Any, dict[str, int]]:
    """Every site file read and checked, and the held-out test data (``--test-data``, the
    task's own test split, or ``None`` for a task without data): one-line errors, before
    anything starts. Returns the files, the test data and each site's examples by name (of
    the sites whose data says its length)."""
    paths = site_paths(data_dir)
    sizes: dict[str, int] = {}
    for path in paths:
        data = load_site_data(path, task)
        if hasattr(data, "__len__"):
            sizes[site_name(path)] = len(data)
    return paths, central_test_data(task, test_data), sizes
