"""``python -m fedweave.learning.training_rank FOLDER RANK WORLD PARENT``: one process of a
site's training across processes (``fedweave/learning/site_processes.py`` starts them all
and keeps them between rounds).

Top to bottom: tie this process's life to its parent's; join the group through the store
file in the group's folder; read the site's task and data as the site does, once; then, for
each job line on stdin (until it closes), load the job's start weights, train this rank's
part of every batch in ``DistributedDataParallel`` (or, for a task that declares
``shards_model``, with the model's parameters sharded across the ranks, FSDP's
``fully_shard``: each layer with parameters, then the whole), rank 0 writes the update and
the metrics, and every rank says ``DONE_PREFIX`` and the job's number on stdout.

A failure is written as one JSON line (``rank-RANK.error``: the reason, and when, on the
monotonic clock every process shares) before the group closes, so a rank that fails on its
own says so before the others fail for want of it; its traceback goes to the site's log (our
stderr) and the exit code is 1. Each training step touches ``rank-RANK.steps``, so the parent
sees which rank stopped moving.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    folder, rank, world, parent = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the line above
        return 1
    import torch.distributed as dist

    from fedweave.learning.site_processes import DONE_PREFIX

    try:
        group = json.loads((folder / "group.json").read_text())
        device = _device(group["device"], rank, world)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            store=dist.FileStore(str(folder / "store"), world), rank=rank, world_size=world,
            timeout=timedelta(seconds=float(group["stall_seconds"])),
        )  # fmt: skip
        site = SiteShare(group["data"])
        for line in sys.stdin:
            job = json.loads(line)
            train(folder / f"job-{job['job']}", rank, site, job, device)
            print(f"{DONE_PREFIX}{job['job']}", flush=True)
    except BaseException as exc:  # said before the group closes: the others fail after it
        _say(folder, rank, exc)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _device(requested: str | None, rank: int, world: int) -> Any:
    """GPU ``rank`` when the site trains on CUDA; else the CPU, with a share of its cores."""
    import torch

    from fedweave.learning.training import pick_device

    device = pick_device(requested)
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    return device


class SiteShare:
    """The site's task and the data it trains on, read once; prepared with a run's
    statistics when a job brings them (kept for the next job with the same)."""

    def __init__(self, data: dict) -> None:
        from fedweave.learning.data import load_site_data
        from fedweave.learning.evaluation_split import hold_out
        from fedweave.learning.tasks import load_task

        self.task = load_task(data["task"])
        self.data = load_site_data(data["path"], self.task, data["label_column"], data["columns"])
        if not data["eval_path"]:
            self.data, _ = hold_out(self.data, float(data["eval_fraction"]))
        self._prepared: tuple[str, Any] | None = None

    def training_data(self, statistics: str | None) -> Any:
        if not statistics:
            return self.data
        if self._prepared is None or self._prepared[0] != statistics:
            from fedweave.learning.statistics import decode_known

            self._prepared = (statistics, self.task.prepare(self.data, decode_known(statistics)))
        return self._prepared[1]


def train(job: Path, rank: int, site: SiteShare, spec: dict, device: Any) -> None:
    """This rank's part of one job's training; rank 0 writes the update and metrics."""
    import numpy as np
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from fedweave.learning.training import TrainConfig
    from fedweave.learning.weights import load_weights_npz, set_weights

    data = site.training_data(spec["statistics"])
    model = site.task.build_model()
    set_weights(model, load_weights_npz(job / "start.npz"))
    if getattr(site.task, "shards_model", False):
        trained = _sharded(model, device)
    else:
        model.to(device)
        trained = DistributedDataParallel(
            model, device_ids=[rank] if device.type == "cuda" else None
        )
    steps = job.parent / f"rank-{rank}.steps"
    steps.touch()
    trained.register_forward_pre_hook(lambda *_: os.utime(steps))
    config = TrainConfig(**{**spec["config"], "rank": rank, "device": str(device)})
    metrics = site.task.train(trained, data, config)
    weights = _whole_weights(model)  # every rank takes part in gathering the shards
    if rank == 0:
        np.savez(job / "update.npz", *weights)  # read once every rank says done
        written = job / "metrics.json.tmp"
        written.write_text(json.dumps({k: float(v) for k, v in metrics.items()}))
        written.replace(job / "metrics.json")
    dist.barrier()  # rank 0's files are written before any rank says it is done


def _sharded(model: Any, device: Any) -> Any:
    """``model`` with its parameters sharded over the group (FSDP2's ``fully_shard``), each
    direct child that holds parameters a unit of its own, moved to ``device`` and sharded one
    at a time: on a GPU a rank holds its shards and, while sharding, one layer whole."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _whole_weights(model: Any) -> list:
    """The model's state as whole CPU arrays, in state-dict order (sharded tensors gathered:
    a collective every rank joins)."""
    from torch.distributed.tensor import DTensor

    return [
        (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu().numpy()
        for value in model.state_dict().values()
    ]


def _say(folder: Path, rank: int, exc: BaseException) -> None:
    """Write ``exc`` as this rank's failure, with when it happened."""
    from fedweave.contract import one_line
    from fedweave.errors import UserError

    reason = one_line(str(exc))
    if not isinstance(exc, UserError):
        reason = f"{type(exc).__name__}: {reason}"
    written = folder / f"rank-{rank}.error.tmp"
    written.write_text(json.dumps({"reason": reason, "at": time.monotonic()}))
    written.replace(folder / f"rank-{rank}.error")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
