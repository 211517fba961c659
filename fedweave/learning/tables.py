"""Tables read by schema, not by position: declared columns, checked values, shared scaling.

A tabular task declares its feature columns (numeric or categorical with a fixed category
list) and its label column (binary, multi-class or regression). A site's CSV or Parquet file
is read by column name in any order (pandas/pyarrow do the parsing); extra columns are
ignored and said once; a missing column, an empty cell, ``n/a``, ``nan``, ``inf``, a
non-numeric value or a label outside the declared classes is refused with the file, the
1-based line and the column, unless the column declares ``impute=True`` (the federated mean).

Numeric features are standardised with means and standard deviations the sites compute
together before round 1 (``fedweave/learning/statistics.py``): each site contributes only its
sums, through secure aggregation when the run has it; they never travel inside the model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.errors import UserError
from fedweave.learning.task import ArrayData, TrainingDefaults

log = logging.getLogger("fedweave.data")

MISSING_TOKENS = frozenset(
    {"", "na", "n/a", "nan", "null", "none", "?", "inf", "+inf", "-inf", "infinity",
     "+infinity", "-infinity"}
)  # fmt: skip
"""Cell texts (case-insensitive, stripped) that count as a missing value."""


@dataclass(frozen=True)
class Numeric:
    """A numeric feature column.

    Attributes:
        name: the column's header.
        impute: fill a missing value with the federated mean (default ``False``: refuse it).
        bounds: ``(low, high)``, public bounds of the column's values (a unit's physical or
            clinical range, a published table's; never read from the sites' data). A value
            outside is clipped to them. Under differential privacy the features are scaled
            with these bounds instead of statistics gathered from the sites, which DP does
            not cover; a task whose numeric columns do not all declare bounds is refused
            under ``--dp``. Default ``None``: not declared.
        aliases: other headers a site's file may give this column (``("BMI",)``); a file
            holding two of them is refused. Not pinned: sites that spell a column
            differently still train together. Default none.
    """

    name: str
    impute: bool = False
    bounds: tuple[float, float] | None = None
    aliases: tuple[str, ...] = ()
    kind: str = field(default="numeric", init=False)

    def __post_init__(self) -> None:
        if self.bounds is not None:
            object.__setattr__(self, "bounds", _checked_bounds(self.name, self.bounds))


def _checked_bounds(name: str, bounds: Any) -> tuple[float, float]:
    try:
        low, high = (float(value) for value in bounds)
    except (TypeError, ValueError):
        raise ValueError(
            f"column '{name}': bounds must be (low, high) numbers, got {bounds!r}"
        ) from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"column '{name}': bounds must be finite with low < high, got {bounds!r}")
    return low, high


@dataclass(frozen=True)
class Categorical:
    """A categorical feature column, one-hot encoded over a fixed category list.

    Attributes:
        name: the column's header.
        categories: every value the column may hold; the list is pinned in the run's schema,
            so every site encodes the same way.
        aliases: other headers a site's file may give this column (as ``Numeric``'s).
    """

    name: str
    categories: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    kind: str = field(default="categorical", init=False)


LABEL_KINDS = ("binary", "multiclass", "regression")


@dataclass(frozen=True)
class Label:
    """The label column.

    Attributes:
        name: the column's header.
        kind: ``"binary"``, ``"multiclass"`` or ``"regression"``.
        classes: the class values as they appear in the file, in index order; binary
            defaults to ``("0", "1")`` (the second one is the positive class).
        bounds: a regression label's public ``(low, high)`` (as ``Numeric``'s): a DP run,
            which gathers no statistics, standardises the label with them. Default
            ``None``: under DP the label is learnt as it is; without DP its mean and
            standard deviation are gathered with the features' either way.
        aliases: other headers a site's file may give the label (as ``Numeric``'s).
    """

    name: str
    kind: str = "binary"
    classes: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in LABEL_KINDS:
            raise ValueError(f"label kind must be one of {LABEL_KINDS}, got {self.kind!r}")
        if self.bounds is not None:
            if self.kind != "regression":
                raise ValueError(f"label '{self.name}': bounds are for a regression label")
            object.__setattr__(self, "bounds", _checked_bounds(self.name, self.bounds))
        if self.kind == "binary" and not self.classes:
            object.__setattr__(self, "classes", ("0", "1"))
        if self.kind == "binary" and len(self.classes) != 2:
            raise ValueError(f"a binary label has 2 classes, got {self.classes}")
        if self.kind == "multiclass" and len(self.classes) < 2:
            raise ValueError("a multiclass label needs its class list (2 or more)")


@dataclass(frozen=True)
class TabularSchema:
    """Feature columns in model-input order, and the label."""

    features: tuple[Numeric | Categorical, ...]
    label: Label

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for column in (*self.features, self.label):
            for header in (column.name, *column.aliases):
                if header in seen:
                    raise ValueError(
                        f"header '{header}' stands for both column '{seen[header]}' and "
                        f"column '{column.name}'; give each header to one column"
                    )
                seen[header] = column.name

    @property
    def numeric(self) -> list[Numeric]:
        return [f for f in self.features if isinstance(f, Numeric)]

    @property
    def categorical(self) -> list[Categorical]:
        return [f for f in self.features if isinstance(f, Categorical)]

    @property
    def width(self) -> int:
        """Model inputs: one per numeric column, one per category."""
        return len(self.numeric) + sum(len(c.categories) for c in self.categorical)

    def pinned(self) -> dict[str, Any]:
        """The schema as the run pins it: names, kinds, order, categories, label classes."""
        return {
            "features": [
                _pinned_numeric(f)
                if isinstance(f, Numeric)
                else {"name": f.name, "kind": f.kind, "categories": list(f.categories)}
                for f in self.features
            ],
            "label": {
                "name": self.label.name, "kind": self.label.kind,
                "classes": list(self.label.classes),
                **({"bounds": list(self.label.bounds)} if self.label.bounds else {}),
            },
        }  # fmt: skip

    def digest(self) -> str:
        """SHA-256 of the pinned schema (12 hex digits): what a site compares with the run's."""
        text = json.dumps(self.pinned(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def difference(self, pinned: dict[str, Any]) -> str | None:
        """How the run's pinned schema differs from this one, in one line (or ``None``)."""
        mine = self.pinned()
        if pinned == mine:
            return None
        theirs_names = [f["name"] for f in pinned.get("features", [])]
        mine_names = [f["name"] for f in mine["features"]]
        if theirs_names != mine_names:
            missing = [n for n in theirs_names if n not in mine_names]
            extra = [n for n in mine_names if n not in theirs_names]
            if missing or extra:
                return (
                    f"the run's features lack {extra or 'nothing'} and add "
                    f"{missing or 'nothing'} compared with this site's task"
                )
            return "the run orders the feature columns differently from this site's task"
        for theirs, ours in zip(pinned["features"], mine["features"]):
            if theirs != ours:
                return f"column '{ours['name']}' is declared {theirs} by the run, {ours} here"
        return f"the label is declared {pinned.get('label')} by the run, {mine['label']} here"


@dataclass
class Table:
    """A site's table as read, before scaling.

    Attributes:
        numeric: float64 ``(n, numeric columns)``; NaN where an imputable value is missing.
        categorical: int64 ``(n, categorical columns)``: the category's index.
        labels: int64 class indices, or float32 values for regression.
        source: the file it came from (for messages).
    """

    numeric: np.ndarray
    categorical: np.ndarray
    labels: np.ndarray
    source: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: np.ndarray) -> Table:
        return Table(
            self.numeric[indices], self.categorical[indices], self.labels[indices], self.source
        )


def read_frame(path: Path):
    """A CSV (every cell as text) or Parquet file as a DataFrame; one-line errors."""
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        from fedweave.extras import require

        require("parquet", f"{path}: reading Parquet")  # or save the table as .csv
    try:
        if suffix == ".csv":
            frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
        elif suffix in (".parquet", ".pq"):
            frame = pd.read_parquet(path)
        else:
            raise UserError(f"{path}: unsupported table type '{suffix}'; use .csv or .parquet")
    except pd.errors.EmptyDataError as exc:
        raise UserError(f"{path}: the file is empty; it needs a header row and data") from exc
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: not a readable table ({first})") from exc
    frame.columns = [str(c).strip() for c in frame.columns]
    return frame


def _line(row: int, path: Path) -> str:
    """Where row ``row`` (0-based data row) is in the file: CSV line (header is line 1)."""
    return f"line {row + 2}" if path.suffix.lower() == ".csv" else f"row {row + 1}"


def _as_text(values) -> np.ndarray:
    return np.array(["" if v is None else str(v).strip() for v in values], dtype=object)


def _missing_mask(text: np.ndarray) -> np.ndarray:
    return np.array([t.lower() in MISSING_TOKENS for t in text], dtype=bool)


def numeric_column(frame, column: Numeric, path: Path) -> np.ndarray:
    """``column`` as float64, NaN where an imputable value is missing; anything else that is
    not a finite number refused with its line."""
    import pandas as pd

    text = _as_text(frame[column.name].to_numpy())
    missing = _missing_mask(text)
    numbers = pd.to_numeric(pd.Series(np.where(missing, "nan", text)), errors="coerce")
    values = np.array(numbers, dtype=np.float64)
    bad = np.flatnonzero(~missing & ~np.isfinite(values))
    if len(bad):
        row = int(bad[0])
        raise UserError(
            f"{path}: {_line(row, path)}, column '{column.name}': '{text[row]}' is not a "
            "number; fix the value"
        )
    if missing.any() and not column.impute:
        row = int(np.flatnonzero(missing)[0])
        shown = text[row] or "an empty cell"
        raise UserError(
            f"{path}: {_line(row, path)}, column '{column.name}': missing value ({shown}); "
            f"fill it in, or declare Numeric('{column.name}', impute=True) in the task"
        )
    values[missing] = np.nan
    return values


def _category_codes(
    text: np.ndarray, allowed: tuple[str, ...], name: str, path: Path
) -> np.ndarray:
    index = {value: i for i, value in enumerate(allowed)}
    codes = np.empty(len(text), dtype=np.int64)
    for row, value in enumerate(text):
        code = index.get(value)
        if code is None:
            what = "missing value" if value.lower() in MISSING_TOKENS else f"'{value}'"
            raise UserError(
                f"{path}: {_line(row, path)}, column '{name}': {what} is not one of the "
                f"declared values {list(allowed)}; fix the value or the task's schema"
            )
        codes[row] = code
    return codes


def _label_column(frame, label: Label, path: Path) -> np.ndarray:
    text = _as_text(frame[label.name].to_numpy())
    if label.kind == "regression":
        return numeric_column(frame, Numeric(label.name), path).astype(np.float32)
    classes = label.classes
    # A numeric file may spell class "1" as "1.0" (Parquet floats): compare as numbers then.
    if all(_is_number(c) for c in classes):
        text = np.array([_canonical_number(t) for t in text], dtype=object)
        classes = tuple(_canonical_number(c) for c in classes)
    return _category_codes(text, classes, label.name, path)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _canonical_number(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else repr(value)


def read_table(
    path: str | Path,
    schema: TabularSchema,
    labelled: bool = True,
    columns: dict[str, str] | None = None,
) -> Table:
    """Read a site's CSV or Parquet file by column name and check every value.

    ``labelled=False`` (scoring new data): the label column may be absent; its values are
    then placeholders (class 0, or 0.0). ``columns``: the site's column map, its headers →
    the task's columns (``fedweave/learning/column_map.py``), applied before the task's
    aliases."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file {path} does not exist; pass --data with a .csv or .parquet")
    frame = _by_task_names(read_frame(path), schema, path, columns, labelled=labelled)
    with_label = labelled or schema.label.name in frame.columns
    wanted = [f.name for f in schema.features] + ([schema.label.name] if with_label else [])
    missing = [name for name in wanted if name not in frame.columns]
    if missing:
        shown = ", ".join(list(frame.columns)[:12])
        cased = {m: [str(c) for c in frame.columns if str(c).lower() == m.lower()] for m in missing}
        hint = "; ".join(
            f"'{c[0]}' differs from '{m}' only in case: rename it, map it (--columns "
            f"map.toml: '{c[0]}' = '{m}'), or declare aliases=('{c[0]}',) on the task's "
            f"column '{m}'"
            for m, c in cased.items() if c
        )  # fmt: skip
        raise UserError(
            f"{path}: no column {', '.join(repr(m) for m in missing)} (the file has: {shown}); "
            + (hint if hint else "rename the column or fix the task's schema")
        )
    if len(frame) == 0:
        raise UserError(f"{path}: the table has a header but no rows; a site needs examples")
    extra = [name for name in frame.columns if name not in wanted]
    if extra:
        log.warning("%s: ignoring column(s) the task does not use: %s", path, ", ".join(extra))
    numeric = np.stack(
        [numeric_column(frame, c, path) for c in schema.numeric], axis=1
    ) if schema.numeric else np.zeros((len(frame), 0))  # fmt: skip
    categorical = np.stack(
        [
            _category_codes(_as_text(frame[c.name].to_numpy()), c.categories, c.name, path)
            for c in schema.categorical
        ],
        axis=1,
    ) if schema.categorical else np.zeros((len(frame), 0), dtype=np.int64)  # fmt: skip
    if with_label:
        labels = _label_column(frame, schema.label, path)
    elif schema.label.kind == "regression":
        labels = np.zeros(len(frame), dtype=np.float32)
    else:
        labels = np.zeros(len(frame), dtype=np.int64)
    return Table(numeric, categorical, labels, str(path))


def _by_task_names(
    frame: Any,
    schema: TabularSchema,
    path: Path,
    columns: dict[str, str] | None = None,
    labelled: bool = True,
) -> Any:
    """``frame`` with its headers renamed to the task's column names: first by the site's
    column map ``columns`` (header → task column; its errors name the map's ``source``),
    then by the aliases the task's columns declare. A map naming a column the task lacks or
    a header the file lacks is refused, and so is a file holding two headers that stand for
    one column (``labelled=False``: a header mapped to the label may be absent)."""
    columns = columns or {}
    the_map = f"the column map {getattr(columns, 'source', None) or '(--columns)'}"
    task_columns = [column.name for column in (*schema.features, schema.label)]
    headers = [str(h) for h in frame.columns]
    shown = ", ".join(headers[:12]) + (", ..." if len(headers) > 12 else "")
    for header, target in columns.items():
        if target not in task_columns:
            raise UserError(
                f"{path}: {the_map} maps {header!r} to {target!r}, which is not one of the "
                f"task's columns ({', '.join(task_columns[:40])}"
                f"{', ...' if len(task_columns) > 40 else ''}); fix the map"
            )
        if header not in headers and (labelled or target != schema.label.name):
            raise UserError(
                f"{path}: {the_map} names {header!r}, which the file has no column of "
                f"(the file has: {shown}); fix the map"
            )
    renames = {}
    for column in (*schema.features, schema.label):
        mapped = [h for h, target in columns.items() if target == column.name and h in headers]
        own = [h for h in (column.name, *column.aliases) if h in headers and h not in columns]
        found = [*mapped, *own]
        if len(found) > 1:
            raise UserError(
                f"{path}: columns {' and '.join(repr(h) for h in found)} both stand for the "
                f"task's column '{column.name}'; keep one of them"
                + (f", or fix {the_map}" if mapped else "")
            )
        if found and found[0] != column.name:
            renames[found[0]] = column.name
    by_map = [f"{h} -> {t}" for h, t in renames.items() if h in columns]
    if by_map:
        log.warning("%s: read with %s: %s", path, the_map, ", ".join(by_map))
    return frame.rename(columns=renames) if renames else frame


def _pinned_numeric(column: Numeric) -> dict[str, Any]:
    pinned: dict[str, Any] = {"name": column.name, "kind": column.kind, "impute": column.impute}
    if column.bounds is not None:  # only when declared: older runs' digests stay as they were
        pinned["bounds"] = list(column.bounds)
    return pinned


def clipped_to_bounds(values: np.ndarray, columns: list[Numeric]) -> np.ndarray:
    """``values`` (``(n, numeric columns)``) with each column that declares bounds clipped to
    them; missing values (NaN) stay missing."""
    lows = np.array([c.bounds[0] if c.bounds else -np.inf for c in columns], dtype=np.float64)
    highs = np.array([c.bounds[1] if c.bounds else np.inf for c in columns], dtype=np.float64)
    if not np.isfinite(lows).any():
        return values
    return np.where(np.isnan(values), values, np.clip(values, lows, highs))


def encode(table: Table, schema: TabularSchema, means: np.ndarray, stds: np.ndarray) -> ArrayData:
    """Model inputs: standardised numeric columns (missing → the mean, i.e. 0) and one-hot
    categories, in the schema's column order."""
    scaled = (table.numeric - means) / stds
    scaled = np.where(np.isnan(scaled), 0.0, scaled)
    parts: list[np.ndarray] = []
    numeric_at = categorical_at = 0
    for column in schema.features:
        if isinstance(column, Numeric):
            parts.append(scaled[:, numeric_at : numeric_at + 1])
            numeric_at += 1
        else:
            one_hot = np.zeros((len(table), len(column.categories)))
            one_hot[np.arange(len(table)), table.categorical[:, categorical_at]] = 1.0
            parts.append(one_hot)
            categorical_at += 1
    x = np.concatenate(parts, axis=1).astype(np.float32) if parts else np.zeros((len(table), 0))
    return ArrayData(x.astype(np.float32), table.labels)


TABULAR_DEFAULTS = TrainingDefaults(optimizer="adamw", lr=0.003, weight_decay=1e-4, batch_size=32)
"""AdamW suits a small MLP on standardised features without tuning."""
