"""Model weights as named NumPy arrays: get/set, fingerprint, and pickle-free files.

Every place a model leaves memory (Flower messages, gossip frames, checkpoints) goes
through these helpers, so the byte layout and the hash are the same everywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedweave.learning.initial_model import file_sha256


def get_named_weights(model: nn.Module) -> OrderedDict[str, np.ndarray]:
    """The model's state (parameters and buffers) as CPU NumPy arrays, in state-dict order."""
    return OrderedDict(
        (name, tensor.detach().cpu().numpy().copy()) for name, tensor in model.state_dict().items()
    )


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """The model's state as a list of arrays (Flower's ``NDArrays``)."""
    return list(get_named_weights(model).values())


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    """Load a list of arrays (in state-dict order) into ``model``; shapes must match."""
    keys = list(model.state_dict().keys())
    if len(keys) != len(weights):
        raise ValueError(f"model has {len(keys)} tensors but {len(weights)} were given")
    state = OrderedDict((k, torch.from_numpy(_writable(w))) for k, w in zip(keys, weights))
    model.load_state_dict(state, strict=True)


def adopt_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    """Load ``weights`` into ``model`` as ``set_weights`` does, taking over each array's memory
    where it can (writable, C-ordered and of the tensor's dtype: the arrays Flower decoded
    from a message for this load alone) instead of copying it. Either way the model's
    tensors are new ones, never the memory it held before, so arrays read out of it without
    a copy (``weights_view``) keep their values. A model that defines its own state, or whose
    tensors share memory (tied weights, which new tensors would untie), is loaded by
    ``set_weights``. ``ValueError`` where the number of tensors or a shape differs."""
    if not adopts_weights(model):
        set_weights(model, weights)
        return
    own = model.state_dict()
    if len(own) != len(weights):
        raise ValueError(f"model has {len(own)} tensors but {len(weights)} were given")
    state = OrderedDict()
    for (key, tensor), array in zip(own.items(), weights):
        array = np.asarray(array)
        if tuple(array.shape) != tuple(tensor.shape):
            raise ValueError(
                f"size mismatch for {key}: {tuple(array.shape)} given, {tuple(tensor.shape)} "
                "in this model"
            )
        flags = array.flags
        if not (flags.writeable and flags.c_contiguous and flags.aligned):
            array = np.array(array, order="C")
        taken = torch.from_numpy(array)
        state[key] = taken if taken.dtype == tensor.dtype else taken.to(tensor.dtype)
    model.load_state_dict(state, strict=True, assign=True)


def adopts_weights(model: nn.Module) -> bool:
    """Whether ``adopt_weights`` gives ``model`` new tensors (its state is PyTorch's own and
    no two of its tensors share memory) rather than copying into the ones it has."""
    stored = [tensor.data_ptr() for tensor in model.state_dict().values() if tensor.numel()]
    return _plain_state(model) and len(set(stored)) == len(stored)


def weights_view(model: nn.Module) -> list[np.ndarray]:
    """``get_weights`` without the copy where the model's tensors are in CPU memory: arrays
    over that memory, for a caller that reads them before the model changes (serialising a
    reply). The next ``adopt_weights`` gives the model new tensors, so they keep their
    values; training the model in place would change them."""
    return [
        tensor.detach().numpy() if tensor.device.type == "cpu" else tensor.detach().cpu().numpy()
        for tensor in model.state_dict().values()
    ]


@contextlib.contextmanager
def borrowed_weights(model: nn.Module, weights: list[np.ndarray]) -> Iterator[nn.Module]:
    """``model`` holding ``weights`` without a copy of them (its parameters and persistent
    buffers become tensors over the arrays' memory; an array of another dtype than the
    model's tensor is converted), for reading only: scoring a model the caller keeps anyway.
    Afterwards the model holds none of that state again (``release_weights``). Shapes and the
    number of tensors must match. A model that defines its own state (an adapted model, whose
    state is its adapters) has the weights copied in (``set_weights``) and keeps them."""
    if not _plain_state(model):
        set_weights(model, weights)
        yield model
        return
    own = model.state_dict()
    if len(own) != len(weights):
        raise ValueError(f"model has {len(own)} tensors but {len(weights)} were given")
    with warnings.catch_warnings():
        # a read-only view of a message's bytes: nothing writes to it while it is borrowed
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        state = OrderedDict(
            (key, torch.from_numpy(np.asarray(array)).to(tensor.dtype))
            for (key, tensor), array in zip(own.items(), weights)
        )
    model.load_state_dict(state, strict=True, assign=True)
    try:
        yield model
    finally:
        release_weights(model)


def release_weights(model: nn.Module) -> None:
    """Let go of ``model``'s parameters and persistent buffers: each becomes a tensor of the
    same shape and dtype on the "meta" device, which stores nothing, until weights are loaded
    again (``borrowed_weights``; ``load_state_dict(..., assign=True)``). Non-persistent
    buffers are left as they are. A model that defines its own state keeps it."""
    if not _plain_state(model):
        return
    nothing = OrderedDict(
        (key, torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"))
        for key, tensor in model.state_dict().items()
    )
    model.load_state_dict(nothing, strict=True, assign=True)


def _plain_state(model: nn.Module) -> bool:
    """Whether ``model``'s state is PyTorch's own (its parameters and persistent buffers)."""
    kind = type(model)
    return (kind.state_dict is nn.Module.state_dict
            and kind.load_state_dict is nn.Module.load_state_dict)  # fmt: skip


def _writable(array: np.ndarray) -> np.ndarray:
    """``array``, or a copy where it is read-only (a view of a message's bytes): torch shares
    a NumPy array's memory and warns on one it may not write."""
    array = np.asarray(array)
    return array if array.flags.writeable else array.copy()


def weights_sha256(weights: list[np.ndarray]) -> str:
    """Fingerprint of the weights' bytes, dtypes and shapes (order matters)."""
    digest = hashlib.sha256()
    for array in weights:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def save_weights_npz(path: str | Path, weights: list[np.ndarray]) -> tuple[str, int]:
    """Write weights to ``path`` atomically (temp file + rename); return (sha256, size).

    The sha256 is of the file's bytes, so a checkpoint can be verified before it is used.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, *weights)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return file_sha256(path), path.stat().st_size  # read a part at a time: a model's bytes


def load_weights_npz(path: str | Path, expected_sha256: str | None = None) -> list[np.ndarray]:
    """Read weights written by ``save_weights_npz``; never unpickles.

    Raises ``ValueError`` when the file's sha256 differs from ``expected_sha256``.
    """
    path = Path(path)
    if expected_sha256 is not None and file_sha256(path) != expected_sha256:
        raise ValueError(f"checkpoint {path} does not match its recorded sha256")
    with np.load(path, allow_pickle=False) as archive:
        return [archive[f"arr_{i}"] for i in range(len(archive.files))]
