"""What a fedweave site and a fedweave coordinator agree on, written once for both sides.

The coordinator (``fedweave.coordinator``) writes these keys and the site
(``fedweave.client``) reads them, or the other way round; neither imports the other.

- App references: the apps the coordinator's Flower App Bundle names; every site runs the
  fedweave it installed, so no code travels (declared in ``fedweave.app_bundle``, which
  checks bundles for both sides).
- Run config (coordinator → every Flower process of the run).
- Node config (``fedweave client`` → its own SuperNode).
- Fit config (coordinator → each sampled site, every round).
- Site outcomes (site → coordinator): error codes for a refused run, a rejected update, a
  simulated straggler's late reply and any other failure, each with its reason.
"""

from __future__ import annotations

import re
from typing import Any

from fedweave.app_bundle import CLIENT_APP_REF, SERVER_APP_REF  # noqa: F401 (the app references)

RUN_ID_KEY = "fw-run-id"
"""Run config: the history run the deployed ServerApp records into."""
RUN_TASK_KEY = "task"
"""Run config: the task every site of the run must hold."""
RUN_OPERATOR_KEY = "fw-operator"
"""Run config: the operator who submitted the run (``fedweave run submit``); absent for the
coordinator's command-line run. A site's policy may name the operators it serves."""
RUN_VERSIONS_KEY = "fw-versions"
"""Run config: the coordinator's fedweave and Flower versions (``versions.described``), which
each site compares with its own before it takes the run (``versions.mismatch``)."""
COMMAND_LINE_OPERATOR = "coordinator"
"""The operator name a site's policy gives the coordinator's own command-line run (no operator
submitted it); no operator may be registered under it."""

NODE_DATA_PATH_KEY = "data-path"
NODE_TASK_KEY = "task"
NODE_MORE_TASKS_KEY = "more-tasks"
"""Node config: the other tasks the site holds, each with its own data file (``fedweave
client --more-tasks``): ``TASK=ABSOLUTE_PATH`` entries joined by ``,``."""
NODE_POLICY_KEY = "policy"
"""Node config: the absolute path of the site's policy file (``fedweave client --policy``),
read again at each run's first message so the site may change it while it serves."""
NODE_LABEL_COLUMN_KEY = "label-column"
NODE_COLUMNS_KEY = "columns"
"""Node config: the absolute path of the site's column map (``fedweave client --columns``:
its table's headers → the task's columns)."""
NODE_BASE_MODEL_KEY = "base-model"
"""Node config: the absolute path of the site's copy of a LoRA run's base model
(``fedweave client --base-model``)."""
NODE_DEVICE_KEY = "device"
NODE_NPROC_KEY = "nproc-per-node"
"""Node config: processes the site's local training runs in (``--nproc-per-node``; absent: 1)."""
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
NODE_REQUIRE_SECURE_AGG_KEY = "require-secure-agg"
"""Node config: ``true`` when the site trains only in rounds its update is masked by SecAgg+
(``fedweave client --require-secure-agg``)."""
NODE_REQUIRE_DP_KEY = "require-dp"
"""Node config: the differential privacy the site requires of a run (``--require-dp``:
``any`` or ``local``; absent: none)."""
NODE_MAX_EPSILON_KEY = "max-epsilon"
"""Node config: the most epsilon the site lets a run's ledger reach (``--max-epsilon``)."""
NODE_MAX_DELTA_KEY = "max-delta"
"""Node config: the most delta the site lets a DP run state its epsilon at (``--max-delta``;
absent: at most 1 / (10 x its training examples), which the site checks itself)."""
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
TASK_PACKAGE_KEY = "fw-task-package"
"""Fit and evaluate config: the installed task package the run pinned (JSON: task, package,
version; ``fedweave/learning/task_packages.py``), which a site must have too; absent for a
built-in or ``module:attr`` task."""
ADAPTER_KEY = "fw-adapter"
"""Fit and evaluate config of a ``--peft lora`` run: its adapter (``AdapterSpec.encode``); the
messages' tensors are the adapter's (``fedweave/learning/adapters.py``)."""
BASE_SHA256_KEY = "fw-base-sha256"
"""Fit and evaluate config of a ``--peft lora`` run: the sha256 of its frozen base model's file,
which the site's ``--base-model`` must have."""
LOCAL_LAYERS_KEY = "fw-local-layers"
"""Fit and evaluate config of a run whose task declares site-local layers
(``fedweave/learning/personal.py``): their module names (comma-separated), which the site's
task must declare too; the messages' tensors are the shared ones."""
PERSONAL_RUN_KEY = "fw-personal-run"
"""Fit and evaluate config beside ``LOCAL_LAYERS_KEY``: the history's run id, which names the
site's file of the run's local layers (a resume keeps it)."""
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
SITE_SPEEDS_KEY = "fw-site-speeds"
"""Fit config (simulation): the spread of site speeds (``fedweave.learning.site_speeds``) and,
with ``SEED_KEY``, this site's place in it: the site reports its job's simulated seconds."""
SIMULATED_DEADLINE_KEY = "fw-simulated-deadline"
"""Fit config (simulation): simulated seconds after which a synchronous round closes."""
SIMULATED_SECONDS_METRIC = "sim_seconds"
"""Fit metric (simulation): the simulated seconds this site's job took (at most the
simulated deadline)."""
PROCESSES_METRIC = "processes"
"""A site's training metric: the processes its local training ran in (``--nproc-per-node``,
above 1 only)."""
MAX_NORM_KEY = "fw-max-update-norm"
JOB_KEY = "fw-job"
"""Fit config (``--schedule async``): the job's number among this site's jobs, so that its
successive jobs on one model step train on differently shuffled data instead of repeating
themselves (and a seeded run on the simulated clock repeats exactly)."""
HOLD_KEY = "fw-hold"
"""Fit config (``--schedule async`` under SecAgg+): keep this job's update at the site, under
the job's number (``JOB_KEY``), until the coordinator asks for it in a SecAgg+ round; the reply
carries the job's metrics and examples but no weights (``fedweave/client/held_updates.py``)."""
DELIVER_KEY = "fw-deliver"
"""Fit config (a secure buffer's SecAgg+ round): the number of the held job whose update this
site sends, masked, scaled by ``STALENESS_WEIGHT_KEY``; the instruction carries no model."""
STALENESS_WEIGHT_KEY = "fw-staleness-weight"
"""Fit config (with ``DELIVER_KEY``): the held update's FedBuff staleness weight."""
HELD_METRIC = "held_job"
"""Fit metric: the number of the job whose update this site holds for a secure buffer."""
COMPRESS_KEY = "fw-compress"
"""Fit config: the run's ``--compress`` spec (``fedweave/learning/compression.py``); the site
sends its compressed update instead of its model. Absent: the model, uncompressed."""
DOWNLINK_KEY = "fw-downlink"
"""Fit and evaluate config (``--downlink fp16``): which tensors of the message's model were
sent at half precision and the dtype each goes back to (``fedweave/downlink.py``);
the coordinator's grid writes it as it rounds them. Absent: the model as the task holds it."""
COMPRESSION_METRIC = "compression"
"""Fit metric: the compression the site's update is in (the coordinator refuses any other)."""
UPLINK_BYTES_METRIC = "uplink_bytes"
"""Site result metric, measured by the coordinator: data bytes of the site's reply."""
DP_MODE_KEY = "fw-dp"
"""Fit config: the run's ``--dp`` mechanism (``none``, ``central``, ``local``), which a site's
privacy floor checks."""
DP_EPSILON_AFTER_KEY = "fw-dp-epsilon-after"
"""Fit config (DP runs): the run's ledger epsilon after this round, every sampled site in it."""
DP_DELTA_KEY = "fw-dp-delta"
"""Fit config (DP runs): the delta the ledger's epsilon is at."""
MAX_CLOCK_SKEW_KEY = "fw-max-clock-skew"
"""Fit config: seconds a site's clock may differ from the coordinator's (``--max-clock-skew``)."""
DELIVERY_ALLOWANCE_KEY = "fw-delivery-allowance"
"""Fit config: seconds an instruction may take to reach a working site (the round's deadline);
how far ahead a site's clock seems is only known up to this delay."""
SECAGG_CLIP_KEY = "fw-secagg-clipping-range"
SECAGG_MAX_WEIGHT_KEY = "fw-secagg-max-weight"
SECAGG_VECTOR_ARRAYS_KEY = "fw-secagg-vector-arrays"
"""Fit config (SecAgg+): the coordinator reads a site's masked vector from an array record
(``fedweave/flower_patches/secagg_vectors.py``), so the site sends it there. Absent (a
coordinator of an earlier fedweave): in Flower's own config record, which both read."""
LOCAL_DP_KEYS = (
    "fw-local-dp-clipping-norm",
    "fw-local-dp-sensitivity",
    "fw-local-dp-epsilon",
    "fw-local-dp-delta",
)

SAMPLE_DP_KEYS = (
    "fw-sample-dp-noise-multiplier",
    "fw-sample-dp-max-grad-norm",
    "fw-sample-dp-delta",
)
"""Fit config (``--dp sample``): DP-SGD's noise multiplier, per-example clipping norm and
delta, which switch on Opacus at the site (``fedweave/learning/sample_dp.py``)."""
SAMPLE_DP_EPSILON_METRIC = "dp_epsilon"
"""Fit metric (``--dp sample``): the site's cumulative epsilon by its own ledger, at the run's
delta."""
NODE_PRIVACY_LEDGER_KEY = "privacy-ledger"
"""Node config: the file a site keeps its own sample-level DP ledger in (``--privacy-ledger``)."""
NODE_PERSONAL_STATE_KEY = "personal-state"
"""Node config: the folder a site keeps its runs' local layers in (``--personal-state``)."""

CLIPPED_FRACTION_METRIC = "secagg_clipped_fraction"
"""Fit metric: share of a site's weights SecAgg+ will clip (reported, never silent)."""
SECONDS_METRIC = "seconds"

MAX_REASON_CHARS = 300
"""A site's reason is its own word: kept to one printable line of at most this many characters."""


class SiteOutcome(Exception):
    """A site's answer that is not a result, raised by the site's code with its reason.

    The site's outermost mod (``fedweave.client.mods.answering_outcomes``) answers it with an
    outcome reply (``outcome_content``: the class's ``code``, the reason and the site's
    name), so the coordinator reads the outcome as data bound to the node that sent it
    (``read_outcome``, ``outcome_of``), never out of exception text.
    """

    status = "failed"
    code = 1000


class SiteRefusal(SiteOutcome):
    """This site cannot take part in this run (wrong task or data, a foreign run bundle,
    a clock too far off, ...); the reason says what to change."""

    status = "refused"
    code = 1001


class UpdateRejected(SiteOutcome):
    """This site refuses to send its own update (not finite, wrong shape, too far from the
    global model); the reason names the problem."""

    status = "rejected"
    code = 1002


class LateWork(SiteOutcome):
    """A simulated straggler whose partial work the strategy drops."""

    status = "late"
    code = 1003


SITE_FAILED_CODE = SiteOutcome.code
"""Any other exception at the site: ``failed``, with its type and first line."""
SITE_OUTCOME_STATUS = {
    kind.code: kind.status for kind in (SiteOutcome, SiteRefusal, UpdateRejected, LateWork)
}
"""A fedweave site's error code → the status the coordinator records for it."""


def one_line(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """``text``'s first non-empty line, printable characters only, at most ``limit`` long."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return "".join(c if c.isprintable() else "?" for c in first)[:limit]


OUTCOME_RECORD = "fedweave.outcome"
"""The config record of an outcome reply: ``code`` (int), ``reason`` (str) and, when the site
has one, ``site-name`` (str)."""


def outcome_content(code: int, reason: str, site_name: str | None) -> Any:
    """The content of a site's outcome reply (a Flower ``RecordDict``)."""
    from flwr.app import ConfigRecord, RecordDict

    record = ConfigRecord({"code": int(code), "reason": one_line(reason)})
    if site_name:
        record["site-name"] = str(site_name)
    return RecordDict({OUTCOME_RECORD: record})


def read_outcome(content: Any) -> tuple[int, str, str | None] | None:
    """``(code, reason, site name)`` of an outcome reply's content, None when it holds no
    outcome record; a record with a missing or mistyped field reads as a malformed reply
    (``MALFORMED_CODE``)."""
    record = content.config_records.get(OUTCOME_RECORD)
    if record is None:
        return None
    code, reason, name = record.get("code"), record.get("reason"), record.get("site-name")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(reason, str):
        return MALFORMED_CODE, "outcome without an integer code and a reason", None
    return code, reason, name if isinstance(name, str) else None


MALFORMED_CODE = -1
"""Not a code any site sends: ``outcome_of`` reads it as a malformed reply."""


def outcome_of(code: int, reason: str | None) -> tuple[str, str]:
    """(status, reason) of an error reply with ``code`` and ``reason``: a fedweave site's own
    outcome, Flower's (``lost`` for a node it lost, else ``failed``), or ``failed`` with
    ``malformed reply`` for a code neither knows."""
    from fedweave.flower_patches.message_records import ErrorCode

    said = one_line(reason or "") or "no reason given"
    if code == MALFORMED_CODE:
        return "failed", f"malformed reply: {said}"
    if code in SITE_OUTCOME_STATUS:
        return SITE_OUTCOME_STATUS[code], said
    if code == ErrorCode.NODE_UNAVAILABLE:  # the SuperLink lost the site
        return "lost", said
    if code in {value for name, value in vars(ErrorCode).items() if name.isupper()}:
        return "failed", said  # Flower's own: the ClientApp did not load, crashed, ...
    return "failed", f"malformed reply: unknown outcome code {code}"


NODE_COORDINATOR_KEY = "coordinator"
"""Node config: the coordinator's HOST:PORT as this site reaches it (``fedweave client
--coordinator``); a direct transfer (``BULK_TICKET_RECORD``) goes to the same host."""
NODE_CA_CERT_KEY = "ca-cert"
"""Node config: the CA certificate the coordinator's must verify with (absent: ``--insecure``)."""
BULK_TICKET_RECORD = "fedweave.bulk"
"""The config record of an instruction whose tensors move beside Flower's message
(``fedweave/bulk/``, ``fedweave coordinator --bulk-address``): ``port`` (int), ``token``
(str: this message's grant, for this site only), ``fetch`` (list of ``digest:size``, one per
array record to fetch) and ``records`` (their names, in the same order)."""
BULK_RECEIPT_RECORD = "fedweave.bulk-receipt"
"""The config record of a reply whose array records the site uploaded instead of sending:
``upload`` (str: the grant's id the coordinator's server answered), ``digest`` (sha256 hex)
and ``size`` (int)."""
