"""The large models of issues 24 and 36 as user tasks: digits with a 64-4096-4096-10 MLP
(``TASK``: 17.1M parameters, 68 MB), a 64-8192-8192-10 one (``WIDE``: 67.7M parameters,
271 MB) or a 64-16000-16000-10 one (``HUGE``: 257.2M parameters, 1.03 GB), for
``bench_large_model.py`` (``--task large_model_task:TASK`` with this folder on
``PYTHONPATH``)."""

from fedweave.learning.tasks.digits import DigitsTask

TASK = DigitsTask(hidden=4096)
WIDE = DigitsTask(hidden=8192)
HUGE = DigitsTask(hidden=16000)
