"""The fine-tuning benchmark's task (issue 35): digits with a 64-512-512-10 MLP (300k
parameters), for ``bench_finetune.py`` (``--task finetune_task:TASK`` with this folder on
``PYTHONPATH``). Its adapters at rank 4 are 4% of it, at rank 16 12%. ``PERSONAL``
keeps its output layer at the sites (FedPer: a personal head, never sent)."""

from fedweave.learning.tasks.digits import DigitsTask

TASK = DigitsTask(hidden=512)


class PersonalDigitsTask(DigitsTask):
    """The same model with its output layer (``4``) kept at each site: a personal head."""

    local_layers = ("4",)


PERSONAL = PersonalDigitsTask(hidden=512)
