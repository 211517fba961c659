"""What a fedweave site and a fedweave coordinator agree on, written once for both sides.

The coordinator (``fedweave.coordinator``) writes these keys and the site
(``fedweave.client``) reads them, or the other way round; neither imports the other.

- App references: the apps the coordinator's Flower App Bundle names; every site runs the
  fedweave it installed, so no code travels.
- Run config (coordinator → every Flower process of the run).
- Node config (``fedweave client`` → its own SuperNode).
- Fit config (coordinator → each sampled site, every round).
- Error prefixes (site → coordinator): a refused run, a rejected update or a simulated
  straggler's late reply, with the reason.
"""

from __future__ import annotations

import re

SERVER_APP_REF = "fedweave.coordinator.deployed_app:server_app"
CLIENT_APP_REF = "fedweave.client.deployed_app:app"

RUN_ID_KEY = "fw-run-id"
"""Run config: the history run the deployed ServerApp records into."""
RUN_TASK_KEY = "task"
"""Run config: the task every site of the run must hold."""

NODE_DATA_PATH_KEY = "data-path"
NODE_TASK_KEY = "task"
NODE_LABEL_COLUMN_KEY = "label-column"
NODE_DEVICE_KEY = "device"
NODE_EVAL_DATA_KEY = "eval-data-path"
"""Node config: the site's own evaluation file (``fedweave client --eval-data``)."""
NODE_EVAL_FRACTION_KEY = "eval-fraction"
"""Node config: share of the site's data it holds out to evaluate on (``--eval-fraction``)."""
NODE_SITE_NAME_KEY = "site-name"
"""Node config: the name this site goes by in the history (``fedweave client --name``)."""
SITE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A site name both sides accept: what ``--name`` takes, and all the coordinator records (a
site's word is bounded; the history's column holds 255 characters)."""
SITE_NAME_METRIC = "fw-site-name"
"""Fit metrics: the site's name, which the coordinator records instead of Flower's node id
(a node id changes when a site reconnects; its name does not)."""
NODE_PARTITION_KEY = "partition-id"
"""Node config (simulation only): which ``site-<i>.npz`` of the split a simulated site holds."""

CROSS_SITE_MODEL_KEY = "fw-cross-site-model"
"""Evaluate config: whose last local model this cross-site evaluation scores (its node id;
absent: the global model). The coordinator's evaluate step copies it onto the reply."""

PRIVATE_EVALUATION_KEY = "fw-private-evaluation"
"""Fit config of a private evaluation (``--private-evaluation``): the metric names, comma
separated, in the order of the vector the site returns in place of an update; SecAgg+ sums
the sites' vectors, so the coordinator learns only their example-weighted mean."""

SITE_METRIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
MAX_SITE_METRICS = 64
"""A site's reported metrics are its word: the coordinator keeps at most this many, each
named by ``SITE_METRIC_NAME``, numbers or text of at most 255 characters
(``bounded_site_metrics``)."""


def bounded_site_metrics(metrics: dict) -> dict:
    """The metrics a site reported, as the coordinator keeps them: at most
    ``MAX_SITE_METRICS`` entries named by ``SITE_METRIC_NAME``, numbers and short text only;
    the coordinator's own ``CROSS_SITE_MODEL_KEY`` is never taken from a site."""
    kept: dict = {}
    for name, value in metrics.items():
        if len(kept) >= MAX_SITE_METRICS:
            break
        if not isinstance(name, str) or not SITE_METRIC_NAME.match(name):
            continue
        if name == CROSS_SITE_MODEL_KEY:
            continue
        if isinstance(value, str):
            kept[name] = value[:255]
        elif isinstance(value, (bool, int, float)):
            kept[name] = value
    return kept

ROUND_KEY = "round"
LOCAL_EPOCHS_KEY = "local_epochs"
LR_KEY = "lr"
STATISTICS_STAGE_KEY = "fw-statistics-stage"
"""Fit config: this message asks for the site's federated statistics of this stage (no
training); ``fedweave/learning/statistics.py``."""
STATISTICS_KEY = "fw-statistics"
"""Fit config: the statistics gathered so far (JSON), which the site prepares its data with."""
OPTIMIZER_KEY = "optimizer"
WEIGHT_DECAY_KEY = "weight_decay"
CLIP_GRAD_NORM_KEY = "clip_grad_norm"
BATCH_SIZE_KEY = "batch_size"
SEED_KEY = "seed"
PROXIMAL_MU_KEY = "proximal_mu"
"""Fit config: FedProx's mu; Flower's ``FedProx`` strategy sets this key itself."""
WORK_FRACTION_KEY = "fw-work-fraction"
"""Fit config (simulation): the share of its local work a simulated straggler finishes."""
DROPS_PARTIAL_WORK_KEY = "fw-drops-partial-work"
"""Fit config (simulation): the strategy has no use for a straggler's partial work (FedAvg)."""
MAX_NORM_KEY = "fw-max-update-norm"
MAX_CLOCK_SKEW_KEY = "fw-max-clock-skew"
"""Fit config: seconds a site's clock may differ from the coordinator's (``--max-clock-skew``)."""
DELIVERY_ALLOWANCE_KEY = "fw-delivery-allowance"
"""Fit config: seconds an instruction may take to reach a working site (the round's deadline);
how far ahead a site's clock seems is only known up to this delay."""
SECAGG_CLIP_KEY = "fw-secagg-clipping-range"
SECAGG_MAX_WEIGHT_KEY = "fw-secagg-max-weight"
LOCAL_DP_KEYS = (
    "fw-local-dp-clipping-norm",
    "fw-local-dp-sensitivity",
    "fw-local-dp-epsilon",
    "fw-local-dp-delta",
)

CLIPPED_FRACTION_METRIC = "secagg_clipped_fraction"
"""Fit metric: share of a site's weights SecAgg+ will clip (reported, never silent)."""
SECONDS_METRIC = "seconds"

REJECTED_PREFIX = "fedweave-rejected"
"""Starts a site's error when it refuses to send its own (invalid) update."""
LATE_PREFIX = "fedweave-late"
"""Starts a simulated straggler's error when the strategy drops partial work."""
REFUSED_PREFIX = "fedweave-refused"
"""Starts a site's error when it cannot take part in a run (wrong task or data)."""

SITE_ERROR_STATUS = {REJECTED_PREFIX: "rejected", LATE_PREFIX: "late"}
"""A site's error prefix → the status the round records for that site."""
_SITE_ERROR = re.compile(
    "(" + "|".join(map(re.escape, SITE_ERROR_STATUS)) + r") site (\d+): ([^'\"\n>\\]*)"
)  # the reason ends where Flower's quoting or a (repr-escaped) newline starts


def rejection(site_id: int, problem: str) -> str:
    """The error text of a site that refuses to send its update."""
    return f"{REJECTED_PREFIX} site {site_id}: {problem}"


def late(site_id: int, reason: str) -> str:
    """The error text of a simulated straggler whose partial work the strategy drops."""
    return f"{LATE_PREFIX} site {site_id}: {reason}"


def parse_site_error(text: str) -> tuple[str, str, str] | None:
    """(site id, status, reason) out of an error that carries a site's ``rejection`` (status
    ``rejected``) or a straggler's ``late`` (status ``late``), else None."""
    match = _SITE_ERROR.search(text)
    if match is None:
        return None
    return match.group(2), SITE_ERROR_STATUS[match.group(1)], match.group(3).strip()


def refusal(reason: str) -> str:
    """The error text of a site that refuses a run."""
    return f"{REFUSED_PREFIX}: {reason}"


def readable_failure(text: str | None) -> str:
    """A site's failure reason without Flower's ``Error(code=.., reason="<class ..>:<'..'>")``
    wrapping: a refusal reads ``refused: <reason>``."""
    text = text or "no reason given"
    marker = f"{REFUSED_PREFIX}: "
    if marker in text:
        inner = text.split(marker, 1)[1]
        for tail in ("'>\")", "'>"):
            inner = inner.removesuffix(tail)
        return "refused: " + inner
    return text
