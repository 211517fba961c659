"""A recorded run's model out: the final and the best round's global model as safetensors,
as a ``torch.export`` program (``model.pt2``, ``best.pt2``), and with the preparation that
``fedweave.load_model(DIR)`` needs to take raw columns (``fedweave/learning/exported_model.py``).

Tensor names are the task model's ``state_dict`` keys (buffers included), so::

    model = load_task(TASK).build_model()
    model.load_state_dict(safetensors.torch.load_file("model.safetensors"))

loads it with no position mapping. ``model.json`` beside it says what the model needs to
predict: the task, the rounds exported, the metric that chose the best one, the pinned
data schema, the federated statistics a tabular task standardises its inputs with, and
``preparation``: those statistics as the steps from raw columns to inputs and from outputs to
predictions.
Checkpoints are verified against their recorded sha256 before anything is written; nothing
is pickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.history.metrics import (
    best_round,
    choice_series,
    evaluated_examples,
    ranking_warning,
)
from fedweave.history.records import RunInfo
from fedweave.history.store_errors import HistoryError
from fedweave.learning.exported_model import BEST_PROGRAM_FILE, META_FILE, PROGRAM_FILE
from fedweave.private_files import create_private, write_private_text

FINAL_FILE = "model.safetensors"
BEST_FILE = "best.safetensors"


def checkpoint_weights(row: dict[str, Any]) -> list[np.ndarray]:
    """The global model recorded with round ``row``, checked against its sha256."""
    from fedweave.learning.weights import load_weights_npz

    path = row.get("checkpoint_path")
    if not path:
        raise HistoryError(f"round {row['round']} has no recorded checkpoint")
    try:
        return load_weights_npz(path, row.get("checkpoint_sha256"))
    except OSError as exc:
        raise HistoryError(
            f"checkpoint {path} of round {row['round']} cannot be read ({exc.strerror or exc}); "
            "copy the file back or export from the machine that has it"
        ) from None
    except ValueError as exc:
        raise HistoryError(f"round {row['round']}: {exc}") from None


def named_weights(
    task_spec: str, weights: list[np.ndarray], stored: dict | None = None
) -> dict[str, np.ndarray]:
    """``weights`` by the task model's ``state_dict`` keys (a LoRA run's, its stored config
    ``stored`` recording an adapter: the adapter's; a task's with local layers: its shared
    ones); refused when they do not fit."""
    from fedweave.learning.adapters import AdaptedTask, AdapterSpec, recorded_adapter
    from fedweave.learning.personal import PersonalTask
    from fedweave.learning.tasks import load_task

    task, adapter = load_task(task_spec), recorded_adapter(stored)
    if adapter is not None:
        task = AdaptedTask(task, AdapterSpec.decode(adapter[0]), None, adapter[2])
    layers = tuple((stored or {}).get("local_layers") or ())
    if layers:  # the shared tensors: the sites keep the rest
        task = PersonalTask(task, layers)
    model = task.build_model()
    state = model.state_dict()
    mismatch = len(state) != len(weights) or any(
        tuple(tensor.shape) != array.shape
        for tensor, array in zip(state.values(), weights, strict=False)
    )
    if mismatch:
        raise HistoryError(
            f"the recorded model does not fit task '{task_spec}' as it is installed here "
            f"({len(weights)} tensors recorded, {len(state)} in its model); install the task "
            "code the run used"
        )
    return {name: np.ascontiguousarray(array) for name, array in zip(state, weights, strict=True)}


def chosen_rounds(
    info: RunInfo, rows: list[dict[str, Any]]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any]]:
    """(final round row, best round row, how the best was chosen): rows with a checkpoint
    only; the best by the run's ``select_metric`` / ``select_mode`` (default loss, auto)."""
    with_model = [row for row in rows if row.get("checkpoint_path")]
    if not with_model:
        return None, None, {}
    final = max(with_model, key=lambda row: row["round"])
    evaluation = (info.config.get("settings") or {}).get("evaluation") or {}
    metric = str(evaluation.get("select_metric") or "loss")
    mode = str(evaluation.get("select_mode") or "auto")
    best = best_round(with_model, metric, mode)
    chosen = {"metric": metric, "mode": mode}
    if best is None:
        return final, None, {**chosen, "note": f"no round recorded '{metric}'"}
    number, name, value = best
    chosen["statistic"] = choice_series(with_model, name)[1]
    best_row = next(row for row in with_model if row["round"] == number)
    examples = evaluated_examples(best_row, name)
    # the same model either way when the best round is the final one
    warning = ranking_warning(examples) if number != final["round"] else None
    said = {"examples": examples, "warning": warning}
    return final, best_row, {**chosen, "qualified": name, "round": number, "value": value, **said}


GLOBAL_MODEL = "global"
"""The name ``fedweave evaluate`` gives a run's final global model (``evaluated_models``)."""

def best_model_name(round_number: int) -> str:
    return f"best-round-{round_number}"


@dataclass(frozen=True)
class EvaluatedModel:
    """One model of the evaluated run that every site scores."""

    name: str
    round: int
    row: dict[str, Any]


def evaluated_models(info: Any, rows: list[dict[str, Any]]) -> list[EvaluatedModel]:
    """The run's final model (``global``) and, when its best round by ``--select-metric`` is
    another one, that round's (``best-round-N``); empty without a recorded checkpoint."""
    final, best, _ = chosen_rounds(info, rows)
    if final is None:
        return []
    models = [EvaluatedModel(GLOBAL_MODEL, int(final["round"]), final)]
    if best is not None and best["round"] != final["round"]:
        models.append(EvaluatedModel(best_model_name(int(best["round"])), int(best["round"]), best))
    return models


def recorded_model(
    info: RunInfo, weights: list[np.ndarray], site_layers: Path | None = None
) -> Any:
    """The task's own model (``build_model()``'s) of a run whose recorded ``weights`` are not
    the whole of it: a LoRA run's adapter merged into its base, and a run whose task keeps
    local layers at the sites with a site's own (``site_layers``: its file of the run) or,
    without one, their start (the task's model under the run's seed; a LoRA run's base)."""
    import torch

    from fedweave.learning.adapters import merged_model, recorded_adapter
    from fedweave.learning.personal import PersonalTask, SiteLayers
    from fedweave.learning.tasks import load_task
    from fedweave.learning.weights import set_weights

    task = load_task(info.task)
    layers = tuple(info.config.get("local_layers") or ())
    if layers:
        task = PersonalTask(task, layers)
    torch.manual_seed(int(info.seed or 0))  # the local layers' start, as the sites built it
    if recorded_adapter(info.config) is not None:
        model = merged_model(task, info.config, weights, info.task)
    else:
        model = task.build_model()
        try:
            set_weights(model, weights)
        except (ValueError, RuntimeError) as exc:
            raise HistoryError(
                f"the recorded model does not fit task '{info.task}' as it is installed here "
                f"({str(exc).splitlines()[0][:120]}); install the task code the run used"
            ) from None
    if site_layers is not None:
        try:
            SiteLayers.at(site_layers).load_into(model)
        except Exception as exc:  # not the run's layers: say whose file, load nothing
            raise HistoryError(
                f"{site_layers} does not hold run {info.run_id}'s local layers "
                f"({str(exc).splitlines()[0][:160]})"
            ) from None
    return model.merged()


def export_models(
    info: RunInfo, rows: list[dict[str, Any]], out_dir: Path, statistics: dict[str, Any] | None
) -> list[Path]:
    """Write ``model.safetensors``, ``best.safetensors`` and ``model.json`` for the run's
    ``rows`` (one actor's); returns the files written (none without a checkpoint)."""
    from safetensors.numpy import save_file

    from fedweave.history.metrics import final_privacy
    from fedweave.learning.adapters import (
        ADAPTER_FILES,
        merged_model,
        recorded_adapter,
        save_adapter,
    )
    from fedweave.learning.personal import PersonalTask, unwrapped
    from fedweave.learning.tasks import load_task

    final, best, chosen = chosen_rounds(info, rows)
    if final is None:
        return []
    task = load_task(info.task)
    written = []
    meta: dict[str, Any] = {
        "run_id": info.run_id,
        "task": info.task,
        "mode": info.mode,
        "final_round": final["round"],
        "best": chosen,
        "schema": info.config.get("schema"),
        "statistics": statistics,
        # what the run had spent when its final model was made (the best one spent no more)
        "differential_privacy": final_privacy(
            [row for row in rows if row["round"] <= final["round"]],
            ((info.config.get("settings") or {}).get("privacy") or {}).get("dp", "none"),
        ) or "none",
        "preparation": preparation(task, statistics),
        "load": "model = fedweave.load_model(DIR); model.predict(rows) or model(table); the "
        "weights alone: load_task(task).build_model().load_state_dict("
        "safetensors.torch.load_file(FILE))",
    }
    files = ((final, FINAL_FILE, PROGRAM_FILE), (best, BEST_FILE, BEST_PROGRAM_FILE))
    adapter = recorded_adapter(info.config)
    if adapter is not None:
        meta["adapter"] = {"spec": adapter[0], "base_model": str(adapter[1]),
                           "base_sha256": adapter[2], "files": list(ADAPTER_FILES)}  # fmt: skip
    local = info.config.get("local_layers")
    if local:
        meta["local_layers"] = {
            "layers": list(local),
            "note": "each site keeps its own: these files hold their start; a site scores with "
            "its own: fedweave predict RUN --site NAME (simulated) or --site-layers FILE",
        }
    for row, name, program in files:
        if row is None:
            continue
        if adapter is None and not local:
            tensors = named_weights(info.task, checkpoint_weights(row))
        else:  # the task's own model, loadable as any: the adapters merged into the base, the
            # local layers at their start
            if adapter is not None and name == FINAL_FILE:
                trained = PersonalTask(task, tuple(local)) if local else task
                adapted = merged_model(trained, info.config, checkpoint_weights(row), info.task)
                written += save_adapter(unwrapped(adapted), out_dir)
            tensors = {
                key: value.detach().cpu().numpy().copy()
                for key, value in recorded_model(info, checkpoint_weights(row)).state_dict().items()
            }
        create_private(out_dir / name)
        save_file(
            tensors,
            str(out_dir / name),
            metadata={"run_id": info.run_id, "task": info.task, "round": str(row["round"])},
        )
        written.append(out_dir / name)
        problem = _write_program(task, tensors, out_dir / program)
        if problem is None:
            written.append(out_dir / program)
        else:
            meta["program_note"] = problem
    write_private_text(out_dir / META_FILE, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    written.append(out_dir / META_FILE)
    return written


def preparation(task: Any, statistics: dict[str, Any] | None) -> dict[str, Any] | None:
    """What ``fedweave.load_model`` needs to prepare raw inputs and read the outputs
    (``fedweave/learning/exported_model.py``): a table task's own ``preparation``; a task
    without statistics takes its arrays as they are; ``None`` for a task that prepares its
    data with its own code."""
    from fedweave.learning.prediction import output_kind
    from fedweave.learning.statistics import needs_statistics
    from fedweave.learning.training import objective_of

    own = getattr(task, "preparation", None)
    if callable(own):
        return own(statistics)
    if needs_statistics(task):
        return None
    classes = list(task.label_names()) if hasattr(task, "label_names") else []
    return {
        "kind": "array",
        "input_shape": list(task.input_shape),
        "outputs": {"kind": output_kind(objective_of(task)), "classes": classes},
    }


def _write_program(task: Any, tensors: dict[str, np.ndarray], path: Path) -> str | None:
    """Write the task's network with ``tensors`` as a ``torch.export`` program at ``path``;
    why it could not be (a network ``torch.export`` cannot trace), or ``None``."""
    import torch

    from fedweave.learning.exported_model import network_program

    model = task.build_model()
    model.load_state_dict({name: torch.from_numpy(array) for name, array in tensors.items()})
    try:
        create_private(path)
        network_program(model, tuple(task.input_shape), path)
    except Exception as exc:  # torch.export's refusals are many kinds; the weights still stand
        path.unlink(missing_ok=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"no {path.name}: torch.export could not trace the network ({first[:200]})"
    return None
