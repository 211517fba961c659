"""The fine-tuning benchmark's task (issue 35): digits with a 64-512-512-10 MLP (300k
parameters), for ``bench_finetune.py`` (``--task finetune_task:TASK`` with this folder on
``PYTHONPATH``). Its adapters at rank 4 are 4% of it, at rank 16 12%."""

from fedweave.learning.tasks.digits import DigitsTask

TASK = DigitsTask(hidden=512)
