"""A run's starting point when it is not the task's fresh ``build_model()``: a pretrained model
in a safetensors file (``--initial-model FILE``), checked against the task's model and pinned by
its file's sha256 in the run's stored config, so a resume and every gossip peer start from the
same weights.

A file fits when it holds exactly the model's ``state_dict`` tensors (names, shapes, dtypes)
and every value is finite; ``fedweave history export`` writes such a file
(``model.safetensors``), so one run's model can start the next.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.errors import UserError

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""safetensors' own limit on the JSON header; a longer one is not a safetensors file."""
SHOWN = 4
"""Tensors named per kind of misfit in the one line (the rest are counted)."""


def file_sha256(path: Path) -> str:
    """The sha256 of the file's bytes, as ``sha256sum`` prints it."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _header(path: Path, flag: str = "--initial-model") -> dict[str, Any]:
    """The safetensors header (tensor name → dtype, shape, offsets), or a ``UserError``."""
    not_one = f"{flag} {path} is not a safetensors file"
    try:
        with path.open("rb") as handle:
            size_bytes = handle.read(8)
            if len(size_bytes) < 8:
                raise UserError(f"{not_one} (it is {len(size_bytes)} bytes long)")
            (size,) = struct.unpack("<Q", size_bytes)
            if size > MAX_HEADER_BYTES or size > path.stat().st_size - 8:
                raise UserError(f"{not_one} (its first 8 bytes are no header length)")
            header = json.loads(handle.read(size))
    except OSError as error:
        raise UserError(f"{flag} {path} cannot be read ({error.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError(f"{not_one} (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise UserError(f"{not_one} (its header is not a JSON object)")
    header.pop("__metadata__", None)
    return header


def read_initial_model(
    path: Path, model: Any, task_name: str, flag: str = "--initial-model"
) -> dict[str, np.ndarray]:
    """The tensors of ``path`` as NumPy arrays in ``model``'s state-dict order, after checking
    they are exactly ``model``'s (names, shapes, dtypes) and finite; any misfit is one
    ``UserError`` naming the missing, unexpected and mis-shaped tensors."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"{flag} {path} does not exist; pass a .safetensors file of the task's "
            "model (fedweave history export writes one: model.safetensors)"
        )
    header = _header(path, flag)
    wanted = {
        name: (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        for name, tensor in model.state_dict().items()
    }
    missing = [name for name in wanted if name not in header]
    unexpected = [name for name in header if name not in wanted]
    try:
        arrays = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise UserError(f"{flag} {path} is not a readable safetensors file ({error})") from None
    misfit = [
        f"{name} {list(arrays[name].shape)} {arrays[name].dtype} in the file, "
        f"{list(shape)} {dtype} in the model"
        for name, (shape, dtype) in wanted.items()
        if name in arrays and (arrays[name].shape != shape or arrays[name].dtype.name != dtype)
    ]
    if missing or unexpected or misfit:
        parts = [f"missing {_listed(missing)}"] if missing else []
        parts += [f"unexpected {_listed(unexpected)}"] if unexpected else []
        parts += [f"mis-shaped {_listed(misfit)}"] if misfit else []
        raise UserError(
            f"{flag} {path} does not fit the model of task {task_name!r}: "
            + "; ".join(parts)
            + " (fedweave task describe NAME lists the model's tensors)"
        )
    bad = [
        name
        for name in wanted
        if arrays[name].dtype.kind in "fc" and not np.all(np.isfinite(arrays[name]))
    ]
    if bad:
        raise UserError(f"{flag} {path} holds NaN or infinite values in {_listed(bad)}")
    return {name: arrays[name] for name in wanted}


def load_initial_model(
    model: Any, path: Path, task_name: str, sha256: str | None = None,
    flag: str = "--initial-model",
) -> str:
    """Load ``path`` into ``model`` (checked as ``read_initial_model`` does); returns the
    file's sha256, refusing a file whose sha256 is not ``sha256`` (the run's pin) when given."""
    import torch

    if not Path(path).is_file():
        raise UserError(f"{flag} {path} does not exist; pass the run's initial model")
    digest = file_sha256(Path(path))
    if sha256 is not None and digest != sha256:
        raise UserError(
            f"{flag} {path} has sha256 {digest[:16]}, the run started from "
            f"{sha256[:16]}; pass the run's "
            + ("initial model" if flag == "--initial-model" else "base model (its --initial-model)")
        )
    arrays = read_initial_model(path, model, task_name, flag)
    model.load_state_dict({name: torch.from_numpy(a.copy()) for name, a in arrays.items()})
    return digest


def pinned_initial_model(
    path: Path | None,
    model: Any,
    task_name: str,
    recorded: dict | None,
    resumed: bool,
    needs_file: bool = True,
) -> dict[str, Any] | None:
    """The run's pin of its initial model (stored config ``initial_model``: ``path``,
    ``sha256``, ``tensors``), or None for the task's own initialisation.

    ``recorded`` is a resumed run's pin (``resumed``: this is a resume); a resume keeps it, and
    one given another file, or a file where the run started from the task's own
    initialisation, is refused with both named. ``needs_file``: the run starts from the file
    (a new run, or a resume before its first checkpoint), which is then read and checked
    here, before anything starts; a resume from a checkpoint needs no file."""
    if recorded is None:
        if path is None:
            return None
        if resumed:
            raise UserError(
                "this run started from the task's own initialisation, not from an initial "
                f"model; resume it without --initial-model {path}"
            )
    elif path is None:
        if not needs_file:
            return dict(recorded)  # the resume goes on from the run's checkpoint
        if not Path(recorded["path"]).is_file() or file_sha256(Path(recorded["path"])) != (
            recorded["sha256"]
        ):
            raise UserError(
                f"the run's initial model {recorded['path']} (sha256 "
                f"{recorded['sha256'][:16]}) is gone or changed, and the run has no checkpoint "
                "to go on from; pass that model with --initial-model FILE"
            )
        path = Path(recorded["path"])
    path = Path(path).resolve()
    digest = file_sha256(path) if path.is_file() else None
    if recorded is not None and digest != recorded["sha256"]:
        raise UserError(
            f"--initial-model {path} has sha256 {(digest or 'none: it is missing')[:16]}, "
            f"the run started from {recorded['path']} (sha256 {recorded['sha256'][:16]}); "
            "resume with the run's initial model, or without --initial-model"
        )
    arrays = read_initial_model(path, model, task_name)
    return {"path": str(path), "sha256": digest, "tensors": len(arrays)}


def pin_initial_model(config: Any, stored: dict, run: Any) -> Any:
    """``config`` with its ``initial_model`` the run's pinned file, after
    ``pinned_initial_model`` accepted it; the pin goes into ``stored`` (the run's stored
    config). ``run``: the history run being resumed, or None. Nothing is read (and torch is not
    imported) for a run without an initial model."""
    recorded = (run.config or {}).get("initial_model") if run is not None else None
    path = config.training.initial_model
    if path is None and recorded is None:
        return config
    from fedweave.learning.tasks import load_task

    task = config.data.task
    needs_file = run is None or not run.rounds_completed
    model = load_task(task).build_model()
    pin = pinned_initial_model(path, model, task, recorded, run is not None, needs_file)
    stored["initial_model"] = pin
    return config.replace(initial_model=Path(pin["path"]))
