"""A site's local data: NPZ (``x``, ``y``) and CSV readers with one-line errors, and a writer.

Readers validate against the task (feature count / shape, label range) so a wrong file is
refused before anything connects or trains.
"""

from __future__ import annotations

import inspect
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.errors import UserError
from fedweave.learning.task import ArrayData, NoTaskData, Task


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
    """Read a CSV with a header row: ``label_column`` holds labels, the other columns are the
    features in file order (a task without a schema); every value checked, refused with its
    1-based line and column name (``tables.py`` reads tables by schema instead)."""
    from fedweave.learning.tables import Numeric, numeric_column, read_frame

    frame = read_frame(path)
    header = list(frame.columns)
    if label_column not in header:
        raise UserError(
            f"{path}: no column '{label_column}' (columns: {', '.join(header[:8])}"
            f"{', ...' if len(header) > 8 else ''}); pass --label-column with one of them"
        )
    if len(frame) == 0:
        raise UserError(f"{path}: the table has a header but no rows; a site needs examples")
    columns = {name: numeric_column(frame, Numeric(name), path) for name in header}
    y = _as_labels(columns.pop(label_column), path)
    x = np.stack(list(columns.values()), axis=1).astype(np.float32)
    return ArrayData(x, y)


def load_site_data(
    path: str | Path,
    task: Task,
    label_column: str | None = None,
    columns: str | Path | None = None,
) -> Any:
    """Read a site's data for ``task``: the task's own ``read_site_data`` when it has one
    (a table by schema, an image folder), else a ``.npz``, or a ``.csv`` with
    ``label_column``, as ``ArrayData``. ``columns``: the path of the site's column map
    (``--columns map.toml``, ``fedweave/learning/column_map.py``), for a task that reads
    tables."""
    path = Path(path)
    reader = getattr(task, "read_site_data", None)
    if columns is not None:
        if reader is None or "columns" not in inspect.signature(reader).parameters:
            raise UserError(
                f"--columns maps a table's headers; task '{getattr(task, 'name', task)}' does "
                "not read tables: drop --columns"
            )
    if reader is not None:
        if not path.exists():
            raise UserError(f"data {path} does not exist; pass --data with this site's data")
        if columns is not None:
            from fedweave.learning.column_map import read_column_map

            return reader(path, columns=read_column_map(columns))
        return reader(path)
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


def central_test_data(task: Task, path: str | Path | None, label_column: str | None = None) -> Any:
    """The coordinator's held-out data: ``path`` read like a site's ``--data``, else the
    task's own test split; ``None`` when the task has no data of its own (a real task's
    data lives at the sites, and rounds are scored by federated evaluation)."""
    if path is not None:
        return load_site_data(path, task, label_column)
    try:
        return task.load_data()[1]
    except (NotImplementedError, NoTaskData):
        return None
