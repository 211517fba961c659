"""Optional parts of the install, checked in one place.

``pip install fedweave`` is what a site, a coordinator and a gossip peer need. Simulating many
sites on one machine needs Flower's Ray engine and flwr-datasets' partitioners (with Hugging
Face ``datasets`` and pyarrow): ``pip install 'fedweave[simulation]'``. Reading Parquet site
files needs pyarrow: ``pip install 'fedweave[parquet]'``; ``--track`` needs its tracker's
package: ``pip install 'fedweave[tensorboard]'`` or ``'fedweave[mlflow]'``; ``--peft lora`` needs
``peft``: ``pip install 'fedweave[peft]'``. A command that
needs an extra that is not installed says which one in one line (``UserError``: exit 2, no
traceback) before it imports anything from it.
"""

from __future__ import annotations

import importlib.util

from fedweave.errors import UserError

# extra -> the import names it provides (what is checked; the distributions are in pyproject)
EXTRAS: dict[str, tuple[str, ...]] = {
    "simulation": ("ray", "flwr_datasets", "datasets"),
    "parquet": ("pyarrow",),
    "tensorboard": ("tensorboard",),
    "mlflow": ("mlflow",),
    "peft": ("peft",),
}


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install, or a module blocked from import
        return False


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The import names of ``extra`` (or just ``modules`` of it) that cannot be imported."""
    return [name for name in (modules or EXTRAS[extra]) if not _importable(name)]


def require(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Refuse ``what`` in one line naming the extra to install, unless ``extra`` (or just
    ``modules`` of it) is importable."""
    absent = missing(extra, modules)
    if absent:
        raise UserError(
            f"{what} needs the {extra} extra ({', '.join(absent)} not installed): "
            f"pip install 'fedweave[{extra}]'"
        )
