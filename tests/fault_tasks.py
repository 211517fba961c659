"""Digits tasks with one misbehaving site, for fault-injection tests.

One training example carries a sentinel value; whichever site holds it after the split
misbehaves (raises, sends NaN, a wrong shape, a wrong dtype, or huge noise). With an iid
split exactly one site holds it. The site's whole file counts, not only what it trains on:
the sentinel example may be in the part the site holds out to evaluate on.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedweave.learning.data import read_npz
from fedweave.learning.task import ArrayData
from fedweave.learning.tasks.digits import DigitsTask


class _SiteFile(ArrayData):
    """A site's examples that remember whether its file held the sentinel, in every part."""

    marked = False

    def subset(self, indices: np.ndarray) -> ArrayData:
        part = _SiteFile(self.x[indices], self.y[indices])
        object.__setattr__(part, "marked", self.marked)
        return part


SENTINEL = 7.0  # digits features are in [0, 1]


class _OneBadSite(DigitsTask):
    def load_data(self):
        train, test = super().load_data()
        x = train.x.copy()
        x[0, 0] = SENTINEL
        return type(train)(x, train.y), test

    def read_site_data(self, path) -> ArrayData:
        data = read_npz(path)
        site = _SiteFile(data.x, data.y)
        object.__setattr__(site, "marked", bool((data.x == SENTINEL).any()))
        return site

    def is_bad(self, data) -> bool:
        return bool(getattr(data, "marked", False) or (data.x == SENTINEL).any())

    def misbehave(self, model: nn.Sequential) -> None:
        raise NotImplementedError

    def train(self, model, data, config):
        metrics = super().train(model, data, config)
        if self.is_bad(data):
            self.misbehave(model)
        return metrics


class RaisingDigits(_OneBadSite):
    name = "digits-raising"

    def misbehave(self, model):
        raise RuntimeError("injected fault: this site crashes while training")


class EverySiteRaisingDigits(RaisingDigits):
    name = "digits-every-site-raising"

    def is_bad(self, data) -> bool:
        return True


class NanDigits(_OneBadSite):
    name = "digits-nan"

    def misbehave(self, model):
        with torch.no_grad():
            model[0].weight.fill_(float("nan"))


class WrongShapeDigits(_OneBadSite):
    name = "digits-wrong-shape"

    def misbehave(self, model):
        model[4] = nn.Linear(self.hidden, 11)


class WrongDtypeDigits(_OneBadSite):
    name = "digits-wrong-dtype"

    def misbehave(self, model):
        model[0].weight.data = model[0].weight.data.double()


class NoisyDigits(_OneBadSite):
    name = "digits-noisy"

    def misbehave(self, model):
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 50.0)


SLOW_ONCE_ENV = "FEDWEAVE_TEST_SLOW_ONCE"
"""A path prefix: the bad site's second training (round 2, after start-up) sleeps
``SLOW_SECONDS``, once per run whichever process trains it (marker files ``PREFIX.1`` and
``PREFIX.2`` count the trainings); unset, no site is slow."""
SLOW_SECONDS = 30.0
STALL_SECONDS_ENV = "FEDWEAVE_TEST_STALL_SECONDS"
"""``StallsInRound2Digits``' stall in seconds where set (default ``SLOW_SECONDS``): a test
whose deadline is shorter stalls just past it instead of waiting out the default."""


def _first_to_create(path: str) -> bool:
    import os

    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


class SlowOnceDigits(_OneBadSite):
    """The bad site stalls once, past a round deadline, as a hung GPU job or frozen VM would."""

    name = "digits-slow-once"

    def misbehave(self, model):
        import os
        import time

        prefix = os.environ.get(SLOW_ONCE_ENV)
        if not prefix or _first_to_create(prefix + ".1"):
            return
        if _first_to_create(prefix + ".2"):
            time.sleep(SLOW_SECONDS)


STALLED_ROUND = 2


class StallsInRound2Digits(_OneBadSite):
    """The bad site's training of round 2 sleeps ``SLOW_SECONDS`` (marker ``PREFIX.2``, once
    per run). For the simulation engine, where a late round-1 message may be trained after
    round 2's by another worker, so counting trainings (``SlowOnceDigits``) can stall the
    wrong round. The round comes out of the training seed, which ``TaskClient.fit`` makes
    ``seed * 1_000_003 + round * 1009 + site index``; a simulated site's index is its
    partition (below 1009), a deployed site's is not, so this task is for simulations only."""

    name = "digits-stalls-in-round-2"

    def train(self, model, data, config):
        import os
        import time

        metrics = DigitsTask.train(self, model, data, config)
        prefix = os.environ.get(SLOW_ONCE_ENV)
        stalled_round = (config.seed % 1_000_003) // 1009 == STALLED_ROUND
        if prefix and self.is_bad(data) and stalled_round:
            if _first_to_create(prefix + f".{STALLED_ROUND}"):
                time.sleep(float(os.environ.get(STALL_SECONDS_ENV, SLOW_SECONDS)))
        return metrics


FAIL_MARK, NAN_MARK, NAN_COUNT_MARK, ZEROS_CLAIMING_MARK = 7.0, 8.0, 9.0, 10.0
NAN_SENDING_MARK = 11.0
"""``MarkedDigits``: a site whose file holds this value raises while training, sends NaN
weights, or (an insider) claims NaN examples, or sends zero weights claiming 10**12, or sends
NaN weights after its own update check."""
NAN_AFTER_CHECK_METRIC = "fault_nan_after_check"
"""A fit metric ``MarkedDigits`` sets at a ``NAN_SENDING_MARK`` site, for the rewritten
ClientApp (``_send_nan_after_check``) to know whose reply to rewrite; it never leaves the site."""


def claim_examples(count: float) -> None:
    """Make this process's ClientApp replies claim ``count`` examples, as an insider that
    rewrote its own install would: after every fedweave check and mod of the site, SecAgg+'s
    masking included (whose masks keep the honest weight). The current reply is left as it is:
    it is already being made when the task's code runs."""
    from flwr.clientapp import ClientApp

    if getattr(ClientApp, "claimed_examples", None) is not None:
        return
    call = ClientApp.__call__

    def claiming(self, message, context):
        reply = call(self, message, context)
        record = None if reply.has_error() else reply.content.metric_records.get(
            "fitres.num_examples"
        )  # fmt: skip
        if record is not None:
            record["num_examples"] = count
        return reply

    ClientApp.__call__ = claiming
    ClientApp.claimed_examples = count


class MarkedDigits(DigitsTask):
    """Each site's file says how it behaves (digits features are in [0, 1]): holding
    ``FAIL_MARK`` it raises while training, holding ``NAN_MARK`` it trains NaN weights (which
    its own update check rejects before sending), holding ``NAN_COUNT_MARK`` it trains normally
    and, from its next reply on, claims NaN examples (``claim_examples``), holding
    ``ZEROS_CLAIMING_MARK`` it sends zero weights claiming 10**12 examples
    (``_claim_for_zeros_claiming_sites``); any other site trains normally."""

    name = "digits-marked"

    def read_site_data(self, path) -> ArrayData:
        data = read_npz(path)
        site = _SiteFile(data.x, data.y)
        object.__setattr__(site, "marked", float(data.x.max()))
        if site.marked == ZEROS_CLAIMING_MARK:
            _claim_for_zeros_claiming_sites()
        if site.marked == NAN_SENDING_MARK:
            _send_nan_after_check()
        return site

    def train(self, model, data, config):
        metrics = super().train(model, data, config)
        mark = float(getattr(data, "marked", 0.0))
        if mark == FAIL_MARK:
            raise RuntimeError("injected fault: this site crashes while training")
        if mark == NAN_MARK:
            with torch.no_grad():
                model[0].weight.fill_(float("nan"))
        if mark == NAN_COUNT_MARK:
            claim_examples(float("nan"))
        if mark == ZEROS_CLAIMING_MARK:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.zero_()
        if mark == NAN_SENDING_MARK:
            metrics = {**metrics, NAN_AFTER_CHECK_METRIC: 1}
        return metrics


def _claim_for_zeros_claiming_sites() -> None:
    """Make the fit replies of a site holding ``ZEROS_CLAIMING_MARK`` claim 10**12 examples,
    as its own rewritten install would, from its first reply; other sites that share this
    process (a simulation's worker) are untouched."""
    from fedweave.client.site_app import TaskClient

    if getattr(TaskClient, "claims_for_marked_sites", False):
        return
    fit = TaskClient.fit

    def fit_claiming(self, parameters, config):
        weights, count, metrics = fit(self, parameters, config)
        if float(getattr(self.data, "marked", 0.0)) == ZEROS_CLAIMING_MARK:
            count = 10**12
        return weights, count, metrics

    TaskClient.fit = fit_claiming
    TaskClient.claims_for_marked_sites = True


def _send_nan_after_check() -> None:
    """Make the fit replies whose metrics carry ``NAN_AFTER_CHECK_METRIC`` send NaN weights in
    place of the site's, as its own rewritten install would: after the site's update check and
    every other mod (the honest site would have refused to send them); other sites that share
    this process (a simulation's worker) are untouched."""
    from flwr.app import Array
    from flwr.clientapp import ClientApp

    if getattr(ClientApp, "sends_nan_after_check", False):
        return
    call = ClientApp.__call__

    def sending_nan(self, message, context):
        reply = call(self, message, context)
        if reply.has_error():
            return reply
        metrics = reply.content.config_records.get("fitres.metrics")
        if metrics is None or NAN_AFTER_CHECK_METRIC not in metrics:
            return reply
        del metrics[NAN_AFTER_CHECK_METRIC]
        weights = reply.content.array_records["fitres.parameters"]
        for key in list(weights.keys()):
            weights[key] = Array(np.full_like(weights[key].numpy(), np.nan))
        return reply

    ClientApp.__call__ = sending_nan
    ClientApp.sends_nan_after_check = True


def mark_site(path, mark: float) -> None:
    """Write ``mark`` into the first value of the site file at ``path`` (``MarkedDigits``)."""
    with np.load(path) as data:
        arrays = {name: data[name].copy() for name in data.files}
    arrays["x"][0, 0] = mark
    np.savez(path, **arrays)


def bad_site_index(split_dir) -> int:
    """Which site file holds the sentinel example."""
    for index in range(1000):
        path = split_dir / f"site-{index}.npz"
        if not path.exists():
            break
        if (np.load(path)["x"] == SENTINEL).any():
            return index
    raise LookupError("no site holds the sentinel")


RAY_NODE_DIR_ENV = "FEDWEAVE_TEST_RAY_NODE_DIR"
"""A directory: every training writes the Ray node it ran on there (one empty file per node id
and site); unset, nothing is written."""


class RayNodeDigits(DigitsTask):
    """Digits that note which Ray node trained each site, to see a run spread over a cluster."""

    name = "digits-ray-node"

    def train(self, model, data, config):
        import os
        from pathlib import Path

        import ray

        directory = os.environ.get(RAY_NODE_DIR_ENV)
        if directory and ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()
            (Path(directory) / f"{node}-{os.getpid()}").touch()
        return super().train(model, data, config)


RANK_FAULT_ENV = "FEDWEAVE_TEST_RANK_FAULT"
"""``kill`` or ``stop``: rank 1 of a site's training across processes sends itself SIGKILL or
SIGSTOP at its third training step; unset, it trains like ``digits``. ``once:PATH``-prefixed
(``once:PATH:kill``), only the first rank 1 to create ``PATH`` does."""


class RankFaultDigits(DigitsTask):
    """Digits whose rank 1 dies or stops mid-training (``RANK_FAULT_ENV``)."""

    name = "digits"

    def train(self, model, data, config):
        import os
        import signal

        fault = os.environ.get(RANK_FAULT_ENV, "")
        if fault.startswith("once:"):
            _, path, fault = fault.split(":", 2)
            fault = fault if config.rank == 1 and _first_to_create(path) else ""
        if config.rank == 1 and fault in ("kill", "stop"):
            steps = []
            sent = signal.SIGKILL if fault == "kill" else signal.SIGSTOP

            def misbehave(*_):
                steps.append(1)
                if len(steps) == 3:
                    os.kill(os.getpid(), sent)

            model.register_forward_pre_hook(misbehave)
        return super().train(model, data, config)
