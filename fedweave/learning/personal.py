"""Site-local layers (FedPer-style personalization): a task declares modules of its model
(``local_layers``, by their name in ``model.named_modules()``, e.g. ``("4",)`` for a
``Sequential``'s output layer) whose tensors stay at the site: never sent, never averaged,
kept in the site's own file across rounds and restarts, used by the site's evaluation and by
``fedweave predict --site NAME``.

``PersonalTask`` wraps a task (a task around a task, as ``adapters.AdaptedTask`` does; it
wraps that one too in a LoRA run): its model's ``state_dict()`` holds the shared tensors
only, so every path that moves or keeps a model (Flower's messages, SecAgg+'s vectors,
compression, gossip frames, the coordinator's checkpoints, the bytes the history records)
carries none of the site's own. ``personal_state()`` and ``load_personal_state()`` are the
site's side, ``SiteLayers`` its file.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any

from fedweave.errors import UserError

_PEFT_PREFIX = "base_model.model."
"""What ``peft`` puts before a module's name in an adapter's tensor names."""

_RUN_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def declared_local_layers(task: Any) -> tuple[str, ...]:
    """The module names ``task`` declares site-local (``local_layers``; empty: none)."""
    declared = getattr(task, "local_layers", ()) or ()
    if isinstance(declared, str) or not all(isinstance(name, str) for name in declared):
        raise UserError(
            f"task {getattr(task, 'name', '?')!r}: local_layers must be a tuple of module "
            f"names, not {declared!r}"
        )
    return tuple(declared)


def check_local_layers(task: Any, model: Any) -> tuple[str, ...]:
    """``task``'s local layers, checked against its ``model`` (in a LoRA run, the adapted
    one): each names a module of the task's own model, with tensors, and some tensor is left
    to share (one-line ``UserError``)."""
    layers = declared_local_layers(task)
    if not layers:
        return ()
    own = getattr(task, "task", None)  # an AdaptedTask: the modules are its task's model's
    modules = dict((own.build_model() if own is not None else model).named_modules())
    unknown = [name for name in layers if name not in modules or name == ""]
    if unknown:
        raise UserError(
            f"task {task.name!r} declares local_layers {', '.join(unknown)}, which its model "
            f"does not have; its modules are {', '.join(n for n in modules if n)[:300]}"
        )
    names = list(model.state_dict())
    local = [n for n in names if is_local(n, layers)]
    if not local:
        raise UserError(f"task {task.name!r}: its local_layers {', '.join(layers)} hold no tensor")
    if len(local) == len(names):
        raise UserError(
            f"task {task.name!r}: its local_layers {', '.join(layers)} are the whole model; "
            "nothing would be shared"
        )
    return layers


@lru_cache(maxsize=8)
def task_local_layers(task_spec: str) -> tuple[str, ...]:
    """The local layers task ``task_spec`` declares, checked on its model (once a process)."""
    from fedweave.learning.tasks import load_task

    task = load_task(task_spec)
    return check_local_layers(task, task.build_model())


def refuse_in_gossip(task_spec: str) -> None:
    """Gossip peers do not keep a task's local layers (one-line ``UserError``)."""
    layers = task_local_layers(task_spec)
    if layers:
        raise UserError(
            f"task {task_spec!r} keeps layers {', '.join(layers)} at each site (local_layers); "
            "gossip peers do not keep site-local layers yet: run it federated (fedweave "
            "simulate or coordinator)"
        )


def recorded_personal_config(stored: dict | None, run_id: str) -> dict[str, str]:
    """What sites are told to score a recorded run's models with their own local layers of
    it (``LOCAL_LAYERS_KEY``), empty for a run that shares every tensor."""
    from fedweave.contract import LOCAL_LAYERS_KEY, PERSONAL_RUN_KEY

    layers = (stored or {}).get("local_layers")
    return {LOCAL_LAYERS_KEY: ",".join(layers), PERSONAL_RUN_KEY: run_id} if layers else {}


def is_local(tensor_name: str, layers: tuple[str, ...]) -> bool:
    """Whether a tensor (of the task's model, or of its LoRA adapter) is in a local layer."""
    name = tensor_name.removeprefix(_PEFT_PREFIX)
    return any(name.startswith(layer + ".") for layer in layers)


def _shared_model_class() -> type:
    from torch import nn

    class SharedModel(nn.Module):
        """A model whose ``state_dict`` is its shared tensors; its local layers' tensors
        (``personal_state``) stay with the object that holds it."""

        def __init__(self, inner: Any, layers: tuple[str, ...]) -> None:
            super().__init__()
            self.inner = inner
            self.layers = layers

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner(*args, **kwargs)

        def _split(self, personal: bool) -> OrderedDict:
            return OrderedDict(
                (name, tensor) for name, tensor in self.inner.state_dict().items()
                if is_local(name, self.layers) == personal
            )  # fmt: skip

        def state_dict(self, *args: Any, **kwargs: Any) -> OrderedDict:  # noqa: ARG002
            return self._split(personal=False)

        def personal_state(self) -> OrderedDict:
            """The local layers' tensors (what the site keeps)."""
            return self._split(personal=True)

        def _load(self, state: Any, personal: bool) -> None:
            own = self._split(personal)
            if set(state) != set(own) or (not personal and tuple(state) != tuple(own)):
                missing = [n for n in own if n not in state]
                unexpected = [n for n in state if n not in own]
                raise RuntimeError(
                    f"{'local' if personal else 'shared'} tensors differ: missing "
                    f"{missing[:3]}, unexpected {unexpected[:3]}"
                )
            for name, tensor in own.items():
                if tuple(state[name].shape) != tuple(tensor.shape):
                    raise RuntimeError(
                        f"tensor {name} is {list(state[name].shape)}, this model's is "
                        f"{list(tensor.shape)}"
                    )
            merged = self.inner.state_dict()
            merged.update(state)
            self.inner.load_state_dict(merged)

        def load_state_dict(self, state: Any, strict: bool = True, assign: bool = False) -> Any:
            self._load(state, personal=False)
            return None

        def load_personal_state(self, state: Any) -> None:
            self._load(state, personal=True)

        def merged(self) -> Any:
            """The task's own model with this object's local layers (and, in a LoRA run, the
            adapters merged into its weights)."""
            import copy

            inner = self.inner
            return inner.merged() if hasattr(inner, "merged") else copy.deepcopy(inner)

    return SharedModel


@lru_cache(maxsize=1)
def shared_model_class() -> type:
    """``SharedModel`` (made on first use, so importing this module does not import torch)."""
    return _shared_model_class()


class PersonalTask:
    """``task`` whose model keeps its ``local_layers`` out of its ``state_dict``; every other
    attribute is ``task``'s own."""

    def __init__(self, task: Any, layers: tuple[str, ...]) -> None:
        self.task, self.local_layers = task, layers

    def __getattr__(self, name: str) -> Any:
        if name == "task":  # not set yet (a copy being made): no recursion into itself
            raise AttributeError(name)
        return getattr(self.task, name)

    def build_model(self) -> Any:
        return shared_model_class()(self.task.build_model(), self.local_layers)

    def train(self, model: Any, data: Any, config: Any) -> dict[str, float]:
        """The task's own training, on the model it built (not the wrapper around it)."""
        return self.task.train(unwrapped(model), data, config)

    def evaluate(self, model: Any, data: Any, config: Any) -> dict[str, float]:
        return self.task.evaluate(unwrapped(model), data, config)


def personal_task(task: Any) -> Any:
    """``task`` as a run with its declared local layers trains it (itself when it declares
    none, or is already wrapped)."""
    if isinstance(task, PersonalTask) or not declared_local_layers(task):
        return task
    return PersonalTask(task, check_local_layers(task, task.build_model()))


def unwrapped(model: Any) -> Any:
    """The task's own model inside a ``SharedModel`` (``model`` itself otherwise)."""
    return getattr(model, "inner", model) if hasattr(model, "personal_state") else model


class SiteLayers:
    """One site's file of a run's local layers: ``<folder>/<run key>.safetensors``, written
    atomically and private; read back checked (names, shapes) into the site's model.

    Args:
        folder: the site's folder of local layers (``--personal-state``).
        run_key: the history's run id (a resume keeps it, so the layers carry on).
    """

    def __init__(self, folder: Path, run_key: str) -> None:
        if not _RUN_KEY_RE.match(run_key):
            raise ValueError(f"run key {run_key[:80]!r} is not a run id")
        self.path = Path(folder) / f"{run_key}.safetensors"

    @classmethod
    def at(cls, path: Path) -> SiteLayers:
        """The file at ``path`` (``fedweave predict --site``), which must exist."""
        if not Path(path).is_file():
            raise FileNotFoundError(f"no file {path}")
        layers = cls.__new__(cls)
        layers.path = Path(path)
        return layers

    def load_into(self, model: Any) -> bool:
        """The site's local layers into ``model`` (a ``SharedModel``); False when this site
        has none yet for the run (its first round: the model's own start)."""
        if not self.path.is_file():
            return False
        from safetensors.torch import load_file

        model.load_personal_state(load_file(str(self.path)))
        return True

    def save(self, model: Any) -> None:
        """``model``'s local layers into this site's file (atomically, mode 0600)."""
        from safetensors.torch import save_file

        state = {n: t.detach().cpu().contiguous() for n, t in model.personal_state().items()}
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        os.close(fd)
        try:
            save_file(state, tmp)
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
