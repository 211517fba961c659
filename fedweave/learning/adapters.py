"""Adapters only (``--peft lora``): a task's model started from a pretrained base, frozen, with
LoRA adapters from ``peft`` on its linear and convolutional layers; the output layer trains
fully unless the targets name it.

``AdaptedTask`` wraps a task (a task around a task): its ``build_model()`` is the base model
with the adapters, and that model's ``state_dict()`` is its trainable tensors only, under
``peft``'s adapter names (``base_model.model.0.lora_A.weight``, ``base_model.model.4.weight``).
Every path that moves or keeps a model (Flower's messages, SecAgg+'s vectors, compression,
gossip frames, checkpoints, the bytes the history records) goes through ``state_dict``, so the
frozen base never travels: each site reads it from its own file, checked against the run's
pinned sha256.

The adapter is declared as one string (``AdapterSpec.encode``) that the run's sites are sent and
the history stores: ``lora r=4 alpha=4 targets=0,2 full=4``.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.errors import UserError

ADAPTER_KINDS = ("none", "lora")
"""What ``--peft`` takes: none (every tensor trains and travels) or lora."""

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
"""What ``history export`` writes for a LoRA run beside ``model.safetensors`` (peft's format)."""

_NAME_RE = re.compile(r"^[A-Za-z0-9_.]{1,200}$")


@dataclass(frozen=True)
class AdapterSpec:
    """One run's adapter.

    Attributes:
        rank: LoRA's rank ``r`` (``--lora-rank``).
        alpha: LoRA's ``lora_alpha`` (``--lora-alpha``; the update is scaled by alpha / rank).
        targets: the modules that get adapters (``--lora-targets``), by their name in the
            task's model (``model.named_modules()``).
        full: the modules that train fully and travel whole (the output layer by default).
    """

    rank: int
    alpha: float
    targets: tuple[str, ...]
    full: tuple[str, ...]

    def encode(self) -> str:
        """The spec as one line, what the sites are sent and the history stores."""
        return (
            f"lora r={self.rank} alpha={self.alpha:g} targets={','.join(self.targets)} "
            f"full={','.join(self.full)}"
        )

    @classmethod
    def decode(cls, line: str) -> AdapterSpec:
        """Parse ``encode``'s line (from the coordinator: checked, ``ValueError`` if bad)."""
        if not isinstance(line, str) or len(line) > 4096:
            raise ValueError("adapter spec is not a short string")
        kind, *fields = line.split(" ")
        values = dict(field.partition("=")[::2] for field in fields)
        if kind != "lora" or set(values) != {"r", "alpha", "targets", "full"}:
            raise ValueError(f"adapter spec {line[:80]!r} is not 'lora r= alpha= targets= full='")
        targets = tuple(t for t in values["targets"].split(",") if t)
        full = tuple(t for t in values["full"].split(",") if t)
        if not targets or not all(_NAME_RE.match(n) for n in (*targets, *full)):
            raise ValueError(f"adapter spec {line[:80]!r} names no valid module")
        rank, alpha = int(values["r"]), float(values["alpha"])
        if not 1 <= rank <= 65536 or not 0 < alpha < 1e6:
            raise ValueError(f"adapter spec {line[:80]!r}: rank or alpha out of range")
        return cls(rank, alpha, targets, full)


def adaptable_layers(model: Any) -> list[tuple[str, Any]]:
    """The model's ``nn.Linear`` and ``nn.Conv*`` modules, in module order, with their names."""
    from torch import nn

    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    return [(name, module) for name, module in model.named_modules() if isinstance(module, kinds)]


def _smaller_dimension(module: Any) -> int:
    from torch import nn

    if isinstance(module, nn.Linear):
        return min(module.in_features, module.out_features)
    return min(module.in_channels, module.out_channels)


DEFAULT_RANK = 8
"""LoRA's rank when neither ``--lora-rank`` nor the task's ``peft_config`` says."""


@dataclass(frozen=True)
class DeclaredLora:
    """What a task's ``peft_config`` (a ``peft.LoraConfig``, or a method returning one)
    declares; each field ``None`` where it leaves fedweave's default."""

    rank: int | None = None
    alpha: float | None = None
    targets: tuple[str, ...] | None = None
    full: tuple[str, ...] | None = None


def declared_lora(task: Any, task_name: str) -> DeclaredLora:
    """The task's declared LoRA config (``peft_config``), checked: fedweave honours its ``r``,
    ``lora_alpha``, ``target_modules`` (names, not a pattern) and ``modules_to_save``; a config
    asking for more (dropout, biases, another kind) is one line."""
    declared = getattr(task, "peft_config", None)
    if declared is None:
        return DeclaredLora()
    if callable(declared):
        declared = declared()
    from peft import LoraConfig

    says = f"task {task_name!r} declares a peft_config"
    if not isinstance(declared, LoraConfig):
        raise UserError(f"{says} of type {type(declared).__name__}; fedweave takes a LoraConfig")
    if declared.lora_dropout or declared.bias != "none" or declared.use_dora:
        raise UserError(
            f"{says} with lora_dropout {declared.lora_dropout:g}, bias {declared.bias!r}, "
            f"use_dora {declared.use_dora}: fedweave trains LoRA without dropout, biases or "
            "DoRA yet; drop those from the task's peft_config"
        )
    targets = declared.target_modules
    if isinstance(targets, str):
        raise UserError(
            f"{says} whose target_modules is a pattern ({targets!r}); name the modules "
            "(a list of names from model.named_modules())"
        )
    full = declared.modules_to_save
    return DeclaredLora(
        int(declared.r), float(declared.lora_alpha),
        tuple(sorted(targets)) if targets else None, tuple(full) if full is not None else None,
    )  # fmt: skip


def adapter_spec(
    model: Any, rank: int | None, alpha: float | None, targets: str | None, task_name: str,
    declared: DeclaredLora | None = None,
) -> AdapterSpec:
    """The run's ``AdapterSpec`` for ``model``, checked (one-line ``UserError``): each of
    ``rank``, ``alpha``, ``targets`` (the flags) given, else the task's ``declared`` config's,
    else fedweave's default (rank 8, alpha the rank, targets every linear/convolutional layer
    but the last: the output layer, which trains fully); a rank must be below every target's
    smaller dimension."""
    declared = declared or DeclaredLora()
    rank = rank if rank is not None else declared.rank or DEFAULT_RANK
    alpha = alpha if alpha is not None else declared.alpha
    if targets is None and declared.targets is not None:
        targets = ",".join(declared.targets)
    layers = dict(adaptable_layers(model))
    if not layers:
        raise UserError(
            f"--peft lora: the model of task {task_name!r} has no nn.Linear or nn.Conv layer "
            "to adapt; train it fully (drop --peft)"
        )
    names = list(layers)
    if targets is None:
        if len(names) < 2:
            raise UserError(
                f"--peft lora: the model of task {task_name!r} has one linear layer ({names[0]}),"
                f" its output; name it with --lora-targets {names[0]} to adapt it"
            )
        chosen, full = tuple(names[:-1]), (names[-1],)
    else:
        chosen = tuple(t.strip() for t in targets.split(",") if t.strip())
        unknown = [t for t in chosen if t not in layers]
        if not chosen or unknown:
            raise UserError(
                f"--lora-targets {targets}: {', '.join(unknown) or 'nothing'} is not a linear "
                f"or convolutional layer of task {task_name!r}'s model; its layers are "
                f"{', '.join(names)}"
            )
        full = () if names[-1] in chosen else (names[-1],)
    if declared.full is not None:
        unknown = [n for n in declared.full if n not in dict(model.named_modules())]
        if unknown:
            raise UserError(
                f"task {task_name!r} declares a peft_config whose modules_to_save "
                f"{', '.join(unknown)} are not modules of its model"
            )
        full = declared.full
    too_small = [
        f"{name} ({_smaller_dimension(layers[name])})"
        for name in chosen
        if rank >= _smaller_dimension(layers[name])
    ]
    if too_small:
        raise UserError(
            f"--lora-rank {rank} is not below the smaller dimension of {', '.join(too_small)}; "
            "pick a smaller rank or leave that layer out with --lora-targets"
        )
    return AdapterSpec(rank, float(alpha if alpha is not None else rank), chosen, full)


def _adapt(model: Any, spec: AdapterSpec) -> Any:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.targets),
        modules_to_save=list(spec.full) or None, lora_dropout=0.0, bias="none",
    )  # fmt: skip
    return get_peft_model(model, config)


def _adapted_model_class() -> type:
    from torch import nn

    class AdaptedModel(nn.Module):
        """A ``peft`` model whose state is its trainable tensors, in adapter format."""

        def __init__(self, peft_model: Any) -> None:
            super().__init__()
            self.peft_model = peft_model
            self._names = tuple(self._trainable())

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.peft_model(*args, **kwargs)

        def _trainable(self) -> OrderedDict:
            from peft import get_peft_model_state_dict

            return OrderedDict(get_peft_model_state_dict(self.peft_model))

        def state_dict(self, *args: Any, **kwargs: Any) -> OrderedDict:  # noqa: ARG002
            return self._trainable()

        def load_state_dict(self, state: Any, strict: bool = True, assign: bool = False) -> Any:
            from peft import set_peft_model_state_dict

            given = tuple(state)
            if given != self._names:
                missing = [n for n in self._names if n not in state]
                unexpected = [n for n in given if n not in self._names]
                raise RuntimeError(
                    f"adapter tensors differ: missing {missing[:3]}, unexpected {unexpected[:3]}"
                )
            for name, tensor in self._trainable().items():
                if tuple(state[name].shape) != tuple(tensor.shape):
                    raise RuntimeError(
                        f"adapter tensor {name} is {list(state[name].shape)}, "
                        f"this model's is {list(tensor.shape)}"
                    )
            set_peft_model_state_dict(self.peft_model, state)
            return None

        def merged(self) -> Any:
            """A copy of the task's own model with the adapters merged into its weights."""
            import copy

            return copy.deepcopy(self.peft_model).merge_and_unload()

    return AdaptedModel


@lru_cache(maxsize=1)
def adapted_model_class() -> type:
    """``AdaptedModel`` (made on first use, so importing this module does not import torch)."""
    return _adapted_model_class()


class AdaptedTask:
    """``task`` with its model started from ``base`` (name → array of the task's full
    ``state_dict``) and adapted by ``spec``; every other attribute is ``task``'s own.

    Args:
        task: the run's task.
        spec: the adapter.
        base: the base model's tensors (the run's ``--initial-model``); None: the task's
            fresh model (for the adapter's names and shapes only).
        base_sha256: the sha256 of the base model's file (recorded with the run).
    """

    def __init__(self, task: Any, spec: AdapterSpec, base: dict[str, np.ndarray] | None,
                 base_sha256: str) -> None:  # fmt: skip
        self.task, self.spec, self.base, self.base_sha256 = task, spec, base, base_sha256

    def __getattr__(self, name: str) -> Any:
        if name == "task":  # not set yet (a copy being made): no recursion into itself
            raise AttributeError(name)
        return getattr(self.task, name)

    def build_model(self) -> Any:
        import torch

        model = self.task.build_model()
        if self.base is not None:
            model.load_state_dict({n: torch.from_numpy(a.copy()) for n, a in self.base.items()})
        return adapted_model_class()(_adapt(model, self.spec))


def adapted_task(task: Any, spec_line: str | None, base_path: Path | None, task_name: str,
                 base_sha256: str | None = None) -> Any:  # fmt: skip
    """``task`` as the run trains it: itself without an adapter (``spec_line`` None), else an
    ``AdaptedTask`` over the base model read from ``base_path`` (refused when its sha256 is not
    ``base_sha256``, the run's pin, naming both)."""
    if spec_line is None:
        return task
    from fedweave.extras import require
    from fedweave.learning.initial_model import load_initial_model

    require("peft", "a --peft lora run")

    if base_path is None:
        raise UserError(
            "this run trains LoRA adapters on a pretrained base: start the site with "
            "--base-model FILE.safetensors (the run's --initial-model)"
        )
    model = task.build_model()
    digest = load_initial_model(model, Path(base_path), task_name, base_sha256, flag="--base-model")
    base = {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}
    return AdaptedTask(task, AdapterSpec.decode(spec_line), base, digest)


def run_adapter(config: Any) -> str | None:
    """The encoded adapter of a run's settings (``None`` without ``--peft lora``), checked
    against the task's model."""
    training = config.training
    if training.peft == "none":
        return None
    from fedweave.extras import require
    from fedweave.learning.tasks import load_task

    require("peft", "--peft lora")

    task = load_task(config.data.task)
    return adapter_spec(
        task.build_model(), training.lora_rank, training.lora_alpha, training.lora_targets,
        config.data.task, declared_lora(task, config.data.task),
    ).encode()  # fmt: skip


def run_task(config: Any, base_sha256: str | None = None) -> Any:
    """The task a run's coordinator (or simulation) trains: the task, adapted when the run
    has ``--peft lora`` (its base: the run's ``--initial-model``), its model's tensors the
    shared ones when the task keeps local layers at the sites (``personal.py``)."""
    from fedweave.learning.personal import personal_task
    from fedweave.learning.tasks import load_task

    task = load_task(config.data.task)
    return personal_task(adapted_task(
        task, run_adapter(config), config.training.initial_model, config.data.task, base_sha256
    ))


def recorded_adapter(stored: dict | None) -> tuple[str, Path, str] | None:
    """(adapter line, base model path, base sha256) a run's stored config records, or None
    for a run that trained every tensor."""
    stored = stored or {}
    adapter, base = stored.get("adapter"), stored.get("initial_model") or {}
    if not adapter:
        return None
    return str(adapter), Path(str(base.get("path", ""))), str(base.get("sha256", ""))


def recorded_adapter_config(stored: dict | None) -> dict[str, str]:
    """What sites are told to score a LoRA run's recorded models (its adapter and base's
    sha256, ``ADAPTER_KEY``), empty for a run that trained every tensor."""
    from fedweave.contract import ADAPTER_KEY, BASE_SHA256_KEY

    recorded = recorded_adapter(stored)
    if recorded is None:
        return {}
    return {ADAPTER_KEY: recorded[0], BASE_SHA256_KEY: recorded[2]}


def merged_model(task: Any, stored: dict, weights: list[np.ndarray], task_name: str) -> Any:
    """The ``AdaptedModel`` of a LoRA run (its stored config ``stored``) holding the recorded
    adapter ``weights``, on the run's base read from where it was pinned (a one-line
    ``UserError`` if it is gone or changed); ``task``: the run's task, or its ``PersonalTask``
    (then a ``SharedModel`` around the adapted model, the weights its shared tensors)."""
    import torch

    from fedweave.learning.personal import PersonalTask

    line, base, sha256 = recorded_adapter(stored)  # type: ignore[misc]
    if isinstance(task, PersonalTask):
        adapted = PersonalTask(
            adapted_task(task.task, line, base, task_name, sha256), task.local_layers
        )
    else:
        adapted = adapted_task(task, line, base, task_name, sha256)
    model = adapted.build_model()
    names = list(model.state_dict())
    if len(names) != len(weights):
        raise UserError(
            f"the recorded adapter has {len(weights)} tensors, the run's adapter {len(names)}"
        )
    model.load_state_dict({n: torch.from_numpy(np.asarray(w)) for n, w in zip(names, weights)})
    return model


def save_adapter(model: Any, out_dir: Path) -> list[Path]:
    """Write the adapter alone in ``peft``'s format (``adapter_model.safetensors`` and
    ``adapter_config.json``, loadable with ``peft.PeftModel.from_pretrained(base, out_dir)``
    on the task's model holding the base); returns the files."""
    model.peft_model.save_pretrained(str(out_dir))
    (out_dir / "README.md").unlink(missing_ok=True)  # peft's model card template
    written = [out_dir / name for name in ADAPTER_FILES]
    for path in written:
        path.chmod(0o600)  # private as every other file the export writes
    return written
