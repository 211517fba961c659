"""``breast-cancer``: a tabular example on real data, the Wisconsin diagnostic table that
scikit-learn ships (569 patients, 30 unscaled measurements, benign or malignant).

The features span five orders of magnitude (``mean smoothness`` ~0.1, ``worst area`` up to
4,254), so it does not train without standardisation: the federated statistics provide it.
Every column declares public bounds (``PUBLISHED_MAXIMA``), which a DP run scales with instead.
``write_hospital_files`` writes per-site CSVs as hospitals would hold them (unequal sizes, one
with its columns in another order, one with an extra patient-id column) and a test CSV.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedweave.learning.tables import Label, Numeric
from fedweave.learning.tasks.tabular import TabularTask

CLASSES = ("malignant", "benign")
"""scikit-learn's target order: 0 = malignant, 1 = benign."""


MEASURES = (
    "radius", "texture", "perimeter", "area", "smoothness", "compactness", "concavity",
    "concave points", "symmetry", "fractal dimension",
)  # fmt: skip
"""The ten measurements of each cell nucleus, each given as its mean, error and worst value."""


PUBLISHED_MAXIMA = {
    "mean": (28.11, 39.28, 188.5, 2501.0, 0.163, 0.345, 0.427, 0.201, 0.304, 0.097),
    "error": (2.873, 4.885, 21.98, 542.2, 0.031, 0.135, 0.396, 0.053, 0.079, 0.03),
    "worst": (36.04, 49.54, 251.2, 4254.0, 0.223, 1.058, 1.252, 0.291, 0.664, 0.208),
}
"""Each measurement's maximum as the dataset's own documentation publishes it (UCI's summary
table, in scikit-learn's ``DESCR``), in ``MEASURES`` order. A column's declared bounds are 0
(every measurement is a length, an area, a count or a ratio) to 1.05 times this (the table
itself is rounded), rounded up to two significant digits: public figures, not statistics of
any site's rows."""


def _rounded_up(value: float) -> float:
    unit = 10.0 ** (math.floor(math.log10(value)) - 1)
    return round(math.ceil(value / unit - 1e-9) * unit, 12)


def feature_bounds() -> list[tuple[float, float]]:
    """Each column's declared bounds, in ``feature_names`` order."""
    return [
        (0.0, _rounded_up(1.05 * maximum)) for kind in ("mean", "error", "worst")
        for maximum in PUBLISHED_MAXIMA[kind]
    ]  # fmt: skip


def feature_names() -> list[str]:
    """scikit-learn's 30 column names, in its order (``tests/test_tabular.py`` compares them):
    spelled out here because importing ``sklearn.datasets`` costs ~2 s of CPU in every
    process that loads the task (a site's supervisor and worker among them)."""
    return (
        [f"mean {m}" for m in MEASURES]
        + [f"{m} error" for m in MEASURES]
        + [f"worst {m}" for m in MEASURES]
    )


def make_task(standardise: bool = True) -> TabularTask:
    """The task; ``standardise=False`` feeds the raw measurements (for comparison)."""
    return TabularTask(
        name="breast-cancer",
        features=[
            Numeric(name, bounds=bounds) for name, bounds in zip(feature_names(), feature_bounds())
        ],
        label=Label("diagnosis", kind="binary", classes=CLASSES),
        standardise=standardise,
    )


task = make_task()
raw_task = make_task(standardise=False)


def write_hospital_files(
    out_dir: Path, shares: tuple[float, ...] = (0.5, 0.3, 0.2), test_fraction: float = 0.25
) -> tuple[list[Path], Path]:
    """Per-hospital CSVs of unequal sizes and a held-out ``test.csv`` (fixed shuffle).

    Hospital 2 writes its columns in reverse order; hospital 3 adds a ``patient_id`` column.
    Returns (site files, test file).
    """
    import pandas as pd
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    frame = pd.DataFrame(bunch.data, columns=feature_names())
    frame["diagnosis"] = [CLASSES[int(t)] for t in bunch.target]
    order = np.random.default_rng(20261125).permutation(len(frame))
    frame = frame.iloc[order].reset_index(drop=True)
    n_test = int(round(len(frame) * test_fraction))
    test, pool = frame.iloc[:n_test], frame.iloc[n_test:].reset_index(drop=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    bounds = np.cumsum([0, *(int(round(s * len(pool))) for s in shares)])
    bounds[-1] = len(pool)
    paths = []
    for index in range(len(shares)):
        part = pool.iloc[bounds[index] : bounds[index + 1]].copy()
        if index == 1:
            part = part[list(reversed(part.columns))]
        if index == 2:
            part.insert(0, "patient_id", [f"P{index}-{i:04d}" for i in range(len(part))])
        path = out_dir / f"hospital-{'abc'[index]}.csv"
        part.to_csv(path, index=False)
        paths.append(path)
    test_path = out_dir.parent / "test.csv" if out_dir.name == "sites" else out_dir / "test.csv"
    test.to_csv(test_path, index=False)
    return paths, test_path
