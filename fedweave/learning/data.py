"""A site's local data: NPZ (``x``, ``y``) and CSV readers with one-line errors, and a writer.

Readers validate against the task (feature count / shape, label range) so a wrong file is
refused before anything connects or trains.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from fedweave.errors import UserError
from fedweave.learning.task import ArrayData, Task


def _check_against_task(data: ArrayData, task: Task, source: Path) -> ArrayData:
    expected = tuple(task.input_shape)
    per_example = int(np.prod(expected)) if expected else 0
    x = data.x
    if x.ndim == 2 and len(expected) > 1 and x.shape[1] == per_example:
        x = x.reshape((-1, *expected))  # flat rows (e.g. CSV) for an image task
    if tuple(x.shape[1:]) != expected:
        raise UserError(
            f"{source}: examples have shape {tuple(x.shape[1:])} but task '{task.name}' "
            f"expects {expected}; check the file was made for this task"
        )
    if len(data.y) and (data.y.min() < 0 or data.y.max() >= task.num_classes):
        raise UserError(
            f"{source}: labels must be integers 0..{task.num_classes - 1} for task "
            f"'{task.name}', found {int(data.y.min())}..{int(data.y.max())}"
        )
    return ArrayData(x, data.y)


def _as_labels(values: np.ndarray, source: Path) -> np.ndarray:
    if not np.all(np.isfinite(values)) or not np.all(np.equal(np.mod(values, 1), 0)):
        raise UserError(f"{source}: labels must be whole numbers")
    return values.astype(np.int64)


def read_npz(path: Path) -> ArrayData:
    """Read an NPZ file holding arrays ``x`` (features) and ``y`` (labels); never unpickles."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = {"x", "y"} - set(archive.files)
            if missing:
                raise UserError(
                    f"{path}: NPZ is missing array(s) {', '.join(sorted(missing))}; "
                    "it needs 'x' (features) and 'y' (labels)"
                )
            x, y = archive["x"], archive["y"]
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable NPZ file ({exc})") from exc
    if x.dtype.kind not in "biuf" or y.dtype.kind not in "biuf":
        raise UserError(f"{path}: 'x' and 'y' must be numeric arrays")
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise UserError(
            f"{path}: expected x of shape (n, ...) and y of shape (n,), got {x.shape} and {y.shape}"
        )
    return ArrayData(x.astype(np.float32), _as_labels(y, path))


def read_csv(path: Path, label_column: str) -> ArrayData:
    """Read a CSV with a header row; ``label_column`` holds labels, other columns features."""
    with path.open(newline="") as handle:
        header = handle.readline().strip().split(",")
    header = [name.strip() for name in header]
    if label_column not in header:
        raise UserError(
            f"{path}: no column '{label_column}' (columns: {', '.join(header[:8])}"
            f"{', ...' if len(header) > 8 else ''}); pass --label-column with one of them"
        )
    try:
        table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    except ValueError as exc:
        raise UserError(f"{path}: non-numeric value in the data ({exc})") from exc
    if table.shape[1] != len(header):
        raise UserError(
            f"{path}: rows have {table.shape[1]} values but the header has {len(header)}"
        )
    label_at = header.index(label_column)
    y = _as_labels(table[:, label_at], path)
    x = np.delete(table, label_at, axis=1).astype(np.float32)
    return ArrayData(x, y)


def load_site_data(path: str | Path, task: Task, label_column: str | None = None) -> ArrayData:
    """Read a site's data file (``.npz``, or ``.csv`` with ``label_column``) for ``task``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file {path} does not exist; pass --data with a .npz or .csv file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        data = read_npz(path)
    elif suffix == ".csv":
        if not label_column:
            raise UserError(f"{path}: CSV data needs --label-column NAME")
        data = read_csv(path, label_column)
    else:
        raise UserError(f"{path}: unsupported data file type '{suffix}'; use .npz or .csv")
    return _check_against_task(data, task, path)


def save_site_npz(path: str | Path, data: ArrayData) -> None:
    """Write ``data`` as an NPZ with arrays ``x`` and ``y``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=data.x, y=data.y)
