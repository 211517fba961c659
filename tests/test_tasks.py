"""Tasks: built-ins load real data; user tasks load as module:attr; bad names are clear."""

import os
import subprocess
import sys
import textwrap

import pytest

from fedweave.errors import UserError
from fedweave.learning.task import Task
from fedweave.learning.tasks import load_task


def test_builtin_tasks_have_real_data():
    for name, n_total, shape in (("digits", 1797, (64,)), ("mnist5k", 5000, (1, 28, 28))):
        task = load_task(name)
        train, test = task.load_data()
        assert isinstance(task, Task)
        assert len(train) + len(test) == n_total
        assert train.x.shape[1:] == shape
        assert set(test.y.tolist()) == set(range(10))


def test_digits_are_scikit_learns_read_without_importing_sklearn_datasets():
    """``digits`` reads the CSV scikit-learn ships instead of importing ``sklearn.datasets``
    (~2.3 s of CPU in every process that loads it): the same arrays as ``load_digits``."""
    import numpy as np
    from sklearn.datasets import load_digits

    code = (
        "import sys\n"
        "from fedweave.learning.tasks.digits import digits_arrays\n"
        "pixels, labels = digits_arrays()\n"
        "assert 'sklearn.datasets' not in sys.modules, 'sklearn.datasets was imported'\n"
        "sys.stdout.buffer.write(pixels.tobytes() + labels.astype('int64').tobytes())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    bunch = load_digits()
    cut = bunch.data.size * 8
    assert np.array_equal(np.frombuffer(done.stdout[:cut]).reshape(bunch.data.shape), bunch.data)
    assert np.array_equal(np.frombuffer(done.stdout[cut:], dtype=np.int64), bunch.target)


def test_checking_data_against_a_builtin_task_needs_no_torch(tmp_path):
    """The processes that only check a site's file or a run's settings (the site's supervisor,
    the coordinator) load the task without torch (~2 s of CPU each on 2 cores); what
    ClassificationTask declares it evaluates is what its objective computes."""
    import numpy as np

    from fedweave.learning.objectives import MultiClass
    from fedweave.learning.tasks.classification import ClassificationTask

    data = tmp_path / "site.npz"
    np.savez(data, x=np.zeros((4, 64), np.float32), y=np.arange(4))
    code = (
        "import sys\n"
        "from fedweave.learning.data import load_site_data\n"
        "from fedweave.learning.task_metrics import task_metrics\n"
        "from fedweave.learning.tasks import load_task\n"
        "for name in ('digits', 'mnist5k', 'synthetic-1-1'):\n"
        "    assert task_metrics(load_task(name)) == ('loss', 'accuracy'), name\n"
        f"assert len(load_site_data({str(data)!r}, load_task('digits'), None).y) == 4\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert ClassificationTask.metrics == MultiClass.metrics


def test_user_task_from_module(tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text(
        textwrap.dedent("""
        from fedweave.learning.tasks.digits import DigitsTask
        class Wide(DigitsTask):
            name = "wide-digits"
            def __init__(self):
                super().__init__(hidden=256)
        instance = Wide()
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_task("my_tasks:Wide").name == "wide-digits"
    assert load_task("my_tasks:instance").hidden == 256
    sys.modules.pop("my_tasks", None)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "unknown task 'nope'"),
        ("no_such_module_xyz:task", "cannot import module"),
        ("fedweave.learning.task:missing", "has no attribute"),
        ("fedweave.learning.task:ArrayData", "is not a Task"),
    ],
)
def test_bad_task_specs(spec, message):
    with pytest.raises(UserError, match=message):
        load_task(spec)


def _task_package(root, package: str, version: str, entries: dict[str, str], module: str = ""):
    """An installed distribution as pip leaves it (a .dist-info with its entry points) and
    its module, under ``root`` (put on sys.path by the caller)."""
    info = root / f"{package.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[fedweave.tasks]\n{lines}")
    if module:
        (root / f"{package.replace('-', '_')}.py").write_text(module)


CLINIC_TASK = (
    "from fedweave import Label, Numeric, TabularTask\n"
    "task = TabularTask('diabetes', [Numeric('bmi', aliases=('BMI',)), Numeric('age')],\n"
    "                   Label('progression', 'regression'))\n"
)


def test_a_task_package_registers_its_task_by_name_and_is_pinned_by_version(tmp_path, monkeypatch):
    from fedweave.learning.task_packages import package_problem, pinned_for_run, pinned_package

    _task_package(tmp_path, "clinic-task", "1.2.0", {"diabetes": "clinic_task:task"}, CLINIC_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        task = load_task("diabetes")
        assert task.name == "diabetes" and task.schema.label.kind == "regression"
        pinned = pinned_package("diabetes")
        assert pinned == {"task": "diabetes", "package": "clinic-task", "version": "1.2.0"}
        assert pinned_package("clinic_task:task") is None  # a module:attr spec pins nothing
        assert package_problem(pinned) is None
        older = {**pinned, "version": "1.1.0"}
        assert package_problem(older) == (
            "the run's task 'diabetes' is clinic-task 1.1.0, this site has clinic-task 1.2.0; "
            "install the run's version here (pip install 'clinic-task==1.1.0') or start the "
            "run with this one"
        )
        assert "not installed at this site" in package_problem({**pinned, "task": "other"})
        import json

        from fedweave.client.site_app import _check_task_package
        from fedweave.contract import TASK_PACKAGE_KEY, SiteRefusal

        _check_task_package({TASK_PACKAGE_KEY: json.dumps(pinned)})  # the same: takes part
        with pytest.raises(SiteRefusal, match="this site has clinic-task 1.2.0"):
            _check_task_package({TASK_PACKAGE_KEY: json.dumps(older)})
        with pytest.raises(
            UserError,
            match="was clinic-task 1.1.0 and this machine has "
            "clinic-task 1.2.0; install the run's version",
        ):
            pinned_for_run("diabetes", older)
        listed = subprocess.run(
            [sys.executable, "-m", "fedweave.cli", "task", "list"], capture_output=True,
            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        )  # fmt: skip
        assert "diabetes           clinic-task 1.2.0  (clinic_task:task)" in listed.stdout
        described = subprocess.run(
            [sys.executable, "-m", "fedweave.cli", "task", "describe", "diabetes"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
        )  # fmt: skip
        assert described.returncode == 0, described.stderr
        lines = described.stdout.splitlines()
        assert lines[0] == "task diabetes (clinic-task 1.2.0)"
        assert lines[1] == "objective regression: metrics loss, mae, rmse; headline mae"
        assert f"table digest {task.schema.digest()}, columns in model-input order:" in lines
        assert "  bmi  numeric  (aliases ['BMI'])" in lines and (
            "label progression: regression" in lines
        )
    finally:
        sys.modules.pop("clinic_task", None)


def test_a_broken_or_doubly_registered_task_package_is_one_line(tmp_path, monkeypatch):
    _task_package(tmp_path / "one", "broken-task", "0.1", {"broken": "broken_task:task"},
                  "import numpy\nraise RuntimeError('the model file is missing')\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path / "one"))
    with pytest.raises(UserError) as info:
        load_task("broken")
    assert str(info.value) == (
        "task 'broken': package broken-task 0.1 registers it as broken_task:task, which fails "
        "to import (RuntimeError: the model file is missing); fix or reinstall broken-task"
    )
    sys.modules.pop("broken_task", None)
    _task_package(tmp_path / "two", "clinic-a", "1.0", {"twice": "clinic_a:task"})
    _task_package(tmp_path / "two", "clinic-b", "2.0", {"twice": "clinic_b:task"})
    monkeypatch.syspath_prepend(str(tmp_path / "two"))
    with pytest.raises(UserError, match="task 'twice' is registered by two installed packages"):
        load_task("digits-not-this-one-but-any-lookup")
