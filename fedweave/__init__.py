"""fedweave: federated and serverless learning where sites keep their data.

The public API for your own tasks is importable from here::

    from fedweave import ArrayData, ClassificationTask, Task, TrainConfig
    from fedweave import Categorical, Label, Numeric, TabularTask  # a table's task
    from fedweave import load_model  # an exported run's model, raw columns in

Those names load lazily (they need torch), so ``import fedweave`` and ``fedweave --help`` stay
fast.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("fedweave")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+source"

_PUBLIC = {
    "ArrayData": "fedweave.learning.task",
    "Task": "fedweave.learning.task",
    "load_task": "fedweave.learning.tasks",
    "ClassificationTask": "fedweave.learning.tasks.classification",
    "ImageFolderTask": "fedweave.learning.images",
    "TabularTask": "fedweave.learning.tasks.tabular",
    "Numeric": "fedweave.learning.tables",
    "Categorical": "fedweave.learning.tables",
    "Label": "fedweave.learning.tables",
    "TrainConfig": "fedweave.learning.training",
    "train_epochs": "fedweave.learning.training",
    "evaluate_model": "fedweave.learning.training",
    "UserError": "fedweave.errors",
    "load_model": "fedweave.learning.exported_model",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'fedweave' has no attribute {name!r}")
