"""GPU shares a simulation asks for, checked against the GPUs this machine has.

Flower's simulation engine sizes its actor pool from Ray's view of each node: a site that needs
a GPU share on a node with none (or fewer than the share) fits nowhere, the pool is empty, and
Ray's ``ActorPool is empty`` traceback follows a recorded, failed run that then hangs. A gossip
simulation would write its sites' data and record a run first. So ``--gpus-per-client`` and
``--gpus-per-peer`` are checked here, before anything is written, started or recorded.

With ``--ray-address`` the sites run on a cluster whose GPUs may all sit on other nodes, so
this machine's GPUs say nothing: the check is left to the cluster.
"""

from __future__ import annotations

from fedweave.errors import UserError


def visible_gpus() -> int:
    """CUDA GPUs this process can see (what Ray counts for a node started here): 0 without
    torch's CUDA support or a driver."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # a broken driver install counts as no GPU, as it does for Ray
        return 0


def check_gpu_share(
    flag: str, share: float, ray_address: str | None = None, *, pooled: bool = True
) -> None:
    """Refuse a GPU ``share`` per site that no site could get on this machine.

    ``flag`` is the option as the user wrote it (``--gpus-per-client``), so the one line names
    it. ``pooled``: sites share GPUs through Flower's actor pool, which holds
    ``int(gpus / share)`` sites, so a share above the GPU count is as impossible as any share
    without a GPU. Gossip peers are not pooled (each is pinned to GPU ``int(i * share) % gpus``),
    so for them only "no GPU at all" is impossible.
    """
    if share <= 0 or ray_address:
        return
    gpus = visible_gpus()
    if gpus == 0:
        cluster = ", or run on a Ray cluster with GPUs (--ray-address)" if pooled else ""
        raise UserError(
            f"{flag} {share:g}: no CUDA GPU is visible on this machine; leave {flag} out to "
            f"train on CPU{cluster}"
        )
    if pooled and share > gpus:
        raise UserError(
            f"{flag} {share:g}: this machine has {gpus} CUDA GPU{'s' if gpus > 1 else ''}, so no "
            f"site fits; use {flag} {gpus} or less"
        )
