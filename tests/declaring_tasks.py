"""Digits tasks that declare what a fine-tuning keeps at each site (``local_layers``, issue 35's
personal head) or how it adapts them (``peft_config``), for ``tests/test_personal_layers.py``
and ``tests/test_adapters.py`` (``--task declaring_tasks:PERSONAL`` with this folder on
``PYTHONPATH``), or that a site's processes shard its model (``shards_model``,
``tests/test_site_processes.py``)."""

from __future__ import annotations

from fedweave.learning.tasks.digits import DigitsTask


class PersonalDigits(DigitsTask):
    """Digits' MLP with its output layer (``4``) kept at each site: a personal head."""

    local_layers = ("4",)


class WholeModelLocal(DigitsTask):
    """A declaration that leaves nothing to share (refused)."""

    local_layers = ("0", "2", "4")


class NoSuchLayer(DigitsTask):
    """A declaration naming no module of the model (refused)."""

    local_layers = ("head",)


PERSONAL = PersonalDigits()
WHOLE = WholeModelLocal()
NO_SUCH = NoSuchLayer()


class DeclaredLora(DigitsTask):
    """A task that declares its LoRA: rank 2 on layer 2 only, alpha 4, the output layer fully
    trained (peft's own ``LoraConfig``)."""

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(r=2, lora_alpha=4, target_modules=["2"], modules_to_save=["4"])


class PatternLora(DigitsTask):
    """A declared LoRA whose targets are a pattern (refused: fedweave takes names)."""

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(r=2, target_modules=".*")


DECLARED = DeclaredLora()
PATTERN = PatternLora()


class ShardedDigits(DigitsTask):
    """Digits whose model a site's processes shard among them (FSDP) instead of each holding
    it whole."""

    shards_model = True
