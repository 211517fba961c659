"""The issue-24 large model as a user task: digits with a 64-4096-4096-10 MLP (17.1M
parameters, 68 MB), for ``bench_large_model.py`` (``--task large_model_task:TASK`` with this
folder on ``PYTHONPATH``)."""

from fedweave.learning.tasks.digits import DigitsTask

TASK = DigitsTask(hidden=4096)
