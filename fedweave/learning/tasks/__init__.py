"""The built-in tasks, and ``load_task``: a task by built-in name or ``module:attr``.

The lookup lives here, not in ``fedweave/learning/task.py`` (the protocol every task module
imports), so the protocol never imports a task back.
"""

from __future__ import annotations

import importlib

from fedweave.errors import UserError
from fedweave.learning.task import Task

BUILTIN_TASKS = {
    "digits": "fedweave.learning.tasks.digits:DigitsTask",
    "mnist5k": "fedweave.learning.tasks.mnist5k:Mnist5kTask",
    "digit-folders": "fedweave.learning.tasks.digit_folders:DigitFoldersTask",
    "breast-cancer": "fedweave.learning.tasks.breast_cancer:task",
    "breast-cancer-raw": "fedweave.learning.tasks.breast_cancer:raw_task",
}


def load_task(spec: str) -> Task:
    """Find a task by built-in name (``digits``), by the name an installed task package
    registers (``fedweave/learning/task_packages.py``), or as ``module:attr`` for a user task.

    ``attr`` may be a Task instance, a Task class, or a zero-argument factory.
    """
    if spec.startswith("synthetic-"):
        from fedweave.learning.tasks.synthetic import SyntheticTask

        return SyntheticTask.from_name(spec)
    target = BUILTIN_TASKS.get(spec, spec)
    package = None
    if ":" not in target:
        from fedweave.learning.task_packages import installed_tasks

        installed = installed_tasks()
        package = installed.get(spec)
        if package is None:
            known = ", ".join([*sorted(BUILTIN_TASKS), *sorted(installed)])
            raise UserError(
                f"unknown task '{spec}': use one of {known}, synthetic-A-B (e.g. "
                "synthetic-1-1), synthetic-iid, an installed task package's name "
                "(fedweave task list), or 'my_module:my_task'"
            )
        target = package.target
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a task package's own import error, whatever it is
        if package is None and not isinstance(exc, ImportError):
            raise
        if package is None:
            raise UserError(
                f"task '{spec}': cannot import module '{module_name}' ({exc}); "
                "check the name and that it is on PYTHONPATH"
            ) from exc
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UserError(
            f"task '{spec}': package {package.package} {package.version} registers it as "
            f"{target}, which fails to import ({type(exc).__name__}: {first}); fix or "
            f"reinstall {package.package}"
        ) from exc
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise UserError(f"task '{spec}': module '{module_name}' has no attribute '{attr}'") from exc
    not_a_task = UserError(
        f"task '{spec}' is not a Task: it needs name, input_shape, num_classes, "
        "build_model(), load_data(), train() and evaluate()"
    )
    if isinstance(obj, type) and not isinstance(obj, Task):
        raise not_a_task
    if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Task)):
        try:
            obj = obj()
        except TypeError as exc:
            raise UserError(f"task '{spec}' cannot be created without arguments ({exc})") from exc
    if not isinstance(obj, Task):
        raise not_a_task
    return obj
