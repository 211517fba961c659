"""Every option of every fedweave command, declared once, in sections.

A section is a frozen dataclass of ``setting(...)`` fields (``fedweave/config/fields.py``). The
flag is the field name with dashes (``local_epochs`` → ``--local-epochs``), the config-file key
is ``[section] field``, and field names are unique across sections, so a flag means one thing
in every command that takes it. Which command takes which fields: ``COMMAND_SETTINGS`` below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedweave.config.fields import setting

TASKS_HELP = (
    "Task to train: a built-in name (digits, mnist5k, digit-folders (image folders), "
    "breast-cancer (tabular; -raw without "
    "standardisation); synthetic-A-B, the FedProx paper's "
    "Synthetic(alpha, beta), e.g. synthetic-1-1, or synthetic-iid) or 'my_module:my_task'."
)
STRATEGIES = (
    "fedavg", "fedprox", "fedadam", "fedyogi", "fedmedian", "trimmedavg", "krum", "multikrum",
)  # fmt: skip
ROBUST_STRATEGIES = frozenset({"fedmedian", "trimmedavg", "krum", "multikrum"})
"""These look at each site's update, which SecAgg+ exists to hide (``rules.py`` refuses them
under SecAgg+)."""


@dataclass(frozen=True)
class DataSection:
    """What is learned, from which data, split how (simulations)."""

    task: str = setting("digits", TASKS_HELP + " Every site must hold the same task.")
    data: Path | None = setting(
        None,
        "This site's data: .npz with x and y, or .csv with --label-column; it never leaves "
        "the site.",
        identity=False,
    )
    label_column: str | None = setting(
        None, "Label column of a CSV --data (or --test-data, --eval-data) file.", identity=False
    )
    columns: Path | None = setting(
        None,
        "Column map: a TOML file whose 'columns' table maps this site's table headers to the "
        'task\'s columns (BMI = "bmi"), for --data and --eval-data; the files stay as they are.',
        identity=False,
    )
    test_data: Path | None = setting(
        None, "Held-out data the coordinator evaluates on centrally, read like a site's --data "
        "(default: the task's own test split, if it has one; without either, rounds are "
        "scored by federated evaluation only)."
    )
    data_dir: Path | None = setting(
        None,
        "Simulation: one site per file (.csv, .parquet, .npz) or sub-folder in DIR, each "
        "read and checked as a deployed site reads its --data; --clients is their number.",
        identity=False,
    )
    clients: int = setting(10, "Sites (federated) or peers (gossip) to simulate.", minimum=1)
    partition: str = setting(
        "auto",
        "How data is split across simulated sites: iid (uniform), dirichlet (label skew set by "
        "--alpha), shards (each site holds --shards-per-client classes); auto: the task's own "
        "sites for synthetic-* tasks (which generate each site's data), iid otherwise.",
        choices=("auto", "iid", "dirichlet", "shards"),
    )
    alpha: float = setting(
        0.5, "Dirichlet concentration: smaller means more label skew between sites.", above=0
    )
    shards_per_client: int = setting(2, "Classes per site for --partition shards.", minimum=1)


@dataclass(frozen=True)
class TrainingSection:
    """How every site (or peer) trains locally, identical in every mode."""

    rounds: int = setting(
        20, "Rounds of training to run (a gossip peer given 0 runs until stopped).", minimum=0,
        minimum_in={"simulate": 1, "coordinator": 1},
    )
    local_epochs: int = setting(
        1, "Local epochs each site trains per round (default: the task's).", minimum=1
    )
    optimizer: str = setting(
        "sgd", "Local optimizer: sgd (with the task's momentum) or adamw (default: the task's).",
        choices=("sgd", "adamw"),
    )
    lr: float = setting(0.1, "Local learning rate (default: the task's).", minimum=0)
    weight_decay: float = setting(
        0.0, "Weight decay: L2 with sgd, decoupled with adamw (default: the task's).", minimum=0
    )
    clip_grad_norm: float | None = setting(
        None, "Bound each local step's gradient to this L2 norm (default: the task's; "
        "most tasks: none).", above=0,
    )
    batch_size: int = setting(16, "Local batch size (default: the task's).", minimum=1)
    seed: int = setting(0, "Seeds the split, the initial model and local shuffling.")
    initial_model: Path | None = setting(
        None,
        "Start from this model instead of the task's fresh one: a .safetensors file of the "
        "task's model (names, shapes, dtypes checked; fedweave history export writes one), "
        "pinned by its sha256 in the run's history (a resume and every gossip peer start "
        "from the same file).",
        identity=False,
    )
    peft: str = setting(
        "none",
        "none: every tensor trains and travels; lora: the --initial-model is a frozen base and "
        "only LoRA adapters (peft) and the output layer train, travel, are averaged and "
        "checkpointed.",
        choices=("none", "lora"),
    )
    lora_rank: int | None = setting(
        None, "--peft lora: the adapters' rank r, below every target layer's smaller dimension "
        "(default: the task's declared peft_config's, else 8).", minimum=1,
    )
    lora_alpha: float | None = setting(
        None, "--peft lora: lora_alpha, the adapters' update scaled by alpha / rank (default: "
        "the task's declared peft_config's, else the rank, a scale of 1; 2x the rank diverged "
        "at SGD's usual rates here).", above=0,
    )
    lora_targets: str | None = setting(
        None, "--peft lora: the layers that get adapters, comma-separated names of the model's "
        "nn.Linear/nn.Conv modules (fedweave task describe lists the tensors; default: the "
        "task's declared peft_config's, else every such layer but the last, the output layer, "
        "which trains fully).",
    )
    device: str | None = setting(
        None, "cuda, cuda:N or cpu (default: CUDA when present).", identity=False
    )
    num_workers: int = setting(
        0, "Processes reading this site's data while it trains (0: in the training process; "
        "raise it for data read from disk, e.g. image folders).", minimum=0, identity=False,
    )
    nproc_per_node: int = setting(
        1, "Processes this site's (or peer's) local training runs in, each on its part of "
        "every batch, gradients averaged each step (DistributedDataParallel): one a GPU with "
        "--device cuda (NCCL), one a core on CPU (gloo). The update is the one a single "
        "process makes with the same batch.", minimum=1, identity=False,
    )  # fmt: skip


@dataclass(frozen=True)
class FederationSection:
    """Which sites take part in a federated round and how their updates are combined."""

    min_clients: int = setting(
        3, "Deployment: sites that must be connected before a round starts.", minimum=1
    )
    clients_per_round: int | None = setting(
        None, "Sites sampled each round (default: all).", minimum=1
    )
    sites: str = setting(
        "", "Deployment: only these sites take part, by the names their site keys are "
        "registered under (NAME[,NAME...], the key files' names in TLS_DIR/sites/); others "
        "connected are never sampled. --min-clients counts them. Default: every connected site.",
    )
    strategy: str = setting(
        "fedavg",
        "Aggregation (Flower's implementations); fedmedian, trimmedavg, krum and multikrum "
        "compare single updates and need --no-secure-agg.",
        choices=STRATEGIES,
    )
    proximal_mu: float = setting(
        0.01, "FedProx: weight of the proximal term that keeps sites near the global model.",
        minimum=0,
    )
    max_update_norm: float | None = setting(
        None, "Reject site updates farther than this (L2) from the global model.", minimum=0
    )
    compress: str = setting(
        "none",
        "How sites send their updates: none (the model), fp16, int8 or topk:F (the largest "
        "F of the update's values, F in (0, 1]); the lossy kinds keep what they dropped and "
        "send it later (error feedback). Plain rounds only (SecAgg+ quantizes on its own). "
        "Gossip: fp16 or int8, each peer's whole model.",
    )
    downlink: str = setting(
        "full",
        "How the coordinator sends the global model to the sites: full (as the task holds "
        "it) or fp16 (half the bytes: each floating-point tensor rounded to half precision, "
        "kept whole where half precision cannot hold it; each site trains from it restored "
        "to the task's precision, and the coordinator keeps its own model at full precision).",
        choices=("full", "fp16"),
    )
    round_timeout: float | None = setting(
        None,
        "Seconds a round waits for its sites, training included (SecAgg+ too); sites that "
        "have not replied are recorded late and their replies discarded. Default: sized from "
        "the task (the coordinator times the local work on its own held-out data), or 300 "
        "s when it holds none.",
        above=0, identity=False,
    )
    min_replies: int | None = setting(
        None,
        "Fewest replies a round aggregates; a round with fewer is recorded as failed, keeps "
        "the global model, and the run goes on (default: 1; SecAgg+ also needs its "
        "reconstruction threshold).",
        minimum=1,
    )
    schedule: str = setting(
        "sync",
        "sync: rounds wait for their sampled sites (or their deadline); async: buffered "
        "asynchronous aggregation (FedBuff): every site trains on the newest model it has "
        "and the model moves every --buffer arrivals, each weighted down by its staleness "
        "(fedavg or fedprox, central test data; in arrival order, or on the simulated clock "
        "with --site-speeds). Under SecAgg+ sites hold their updates and each buffer is "
        "summed by its own SecAgg+ round.",
        choices=("sync", "async"),
    )
    buffer: int | None = setting(
        None, "Async: site updates per model step (default: a third of the sites, at least 2; "
        "under SecAgg+ at least 3, a SecAgg+ cohort's smallest).",
        minimum=1,
    )
    max_staleness: int | None = setting(
        None, "Async: discard (and record) an update trained on a model more than this many "
        "steps old (default: none is discarded).", minimum=0,
    )
    server_lr: float | None = setting(
        None, "Async: how far each step moves the model, times the buffer's staleness-weighted "
        "mean update (FedBuff's server learning rate; default 1).", above=0,
    )


@dataclass(frozen=True)
class EvaluationSection:
    """Where the global model is scored: at the sites (federated), on the coordinator's own
    held-out data (central, when it has some), and which round's model is the best."""

    fraction_evaluate: float = setting(
        1.0,
        "Share of the connected sites that score the global model on their own evaluation "
        "data after an evaluated round; each one's metrics and their example-weighted mean "
        "are recorded.",
        above=0, maximum=1,
    )
    evaluate_every: int = setting(
        1, "Federated evaluation every N rounds, and after the last one (0: never).", minimum=0
    )
    eval_fraction: float = setting(
        0.1,
        "A site scores the global model on this share of its --data, held out from its "
        "training (the same examples every round), unless --eval-data gives its own file "
        "(0: the site evaluates only with --eval-data).",
        minimum=0, below=1,
    )
    eval_data: Path | None = setting(
        None,
        "This site's own evaluation file, read like --data (default: --eval-fraction of "
        "--data).",
        identity=False,
    )
    cross_site: bool = setting(
        False,
        "Cross-site evaluation after the last round: every connected site scores the final "
        "global model and, under plain aggregation, each site's own last model (SecAgg+ never "
        "shows the coordinator one); the matrix is recorded with the last round.",
    )
    private_evaluation: bool = setting(
        False,
        "Under SecAgg+: the sites' evaluation figures reach the coordinator only as their "
        "example-weighted mean, through the same secure aggregation as the updates (no "
        "site's own figures are recorded); the task must declare its metrics.",
    )
    run: str | None = setting(
        None,
        "`fedweave evaluate`: the recorded federated run whose final and best models every "
        "connected site scores (its id, or 'latest'); nothing is trained.",
        identity=False, required=True,
    )
    select_metric: str = setting(
        "loss",
        "The metric that picks the best round's model (history export's best.safetensors): "
        "federated evaluation's, or the central one's when sites do not evaluate.",
    )
    select_mode: str = setting(
        "auto",
        "Best is the lowest (min) or highest (max) --select-metric; auto: min for losses and "
        "errors (loss, mae, rmse, mse), max otherwise.",
        choices=("auto", "min", "max"),
    )


@dataclass(frozen=True)
class SecureAggregationSection:
    """SecAgg+: the coordinator only ever sees the sum of the sites' updates."""

    secure_agg: bool = setting(
        True, "SecAgg+ so the coordinator only sees the sum of the sites' models (3+ sites a "
        "round).",
    )
    secagg_timeout: float = setting(
        600.0, "Seconds each SecAgg+ stage waits for sites; slower sites count as dropped.",
        above=0, identity=False,
    )


@dataclass(frozen=True)
class PrivacySection:
    """Differential privacy through Flower's wrappers and mods (see docs)."""

    dp: str = setting(
        "none", "Differential privacy: none, central (coordinator adds noise), local (every "
        "site clips and noises its update) or sample (DP-SGD at every site: each example "
        "clipped to --clipping-norm, noise --noise-multiplier; Opacus). A DP run gathers no "
        "statistics from the sites: a tabular task scales with its columns' declared bounds.",
        choices=("none", "central", "local", "sample"),
    )
    noise_multiplier: float = setting(
        1.0, "Central and sample DP: noise std / clipping norm (> 0; central: per round, "
        "sample: per DP-SGD step).", minimum=0,
    )
    clipping_norm: float = setting(
        1.0, "DP: L2 bound on each site's update (sample DP: on each example's gradient).",
        minimum=0,
    )
    dp_epsilon: float = setting(
        10.0, "Local DP: the epsilon each site's noise is sized for, per round (Flower's "
        "LocalDpMod); the ledger reports what the rounds spend together.", minimum=0,
    )
    dp_delta: float = setting(
        1e-5, "DP: delta, between 0 and 1: the delta the ledger reports epsilon at (and, "
        "under local DP, each round's noise is sized for).", minimum=0,
    )
    target_epsilon: float | None = setting(
        None, "DP: size the noise so the planned --rounds spend at most this epsilon (at "
        "--dp-delta) by the privacy ledger's account; replaces --noise-multiplier (central) "
        "or --dp-epsilon (local). The run header prints what it chose.", above=0,
    )
    max_epsilon: float | None = setting(
        None, "DP budget: a coordinator ends the run, as completed with the reason, before a "
        "round would take the ledger's epsilon past this (also after a resume); a site "
        "(fedweave client) refuses to train in such a round, and in runs without DP.", above=0,
    )


PRIVACY_SETTINGS_APPLYING: dict[str, tuple[str, ...]] = {
    "none": ("dp",),
    "central": (
        "dp", "noise_multiplier", "clipping_norm", "dp_delta", "target_epsilon", "max_epsilon",
    ),
    "local": ("dp", "clipping_norm", "dp_epsilon", "dp_delta", "target_epsilon", "max_epsilon"),
    "sample": ("dp", "noise_multiplier", "clipping_norm", "dp_delta"),
}
"""``--dp`` mode → the privacy settings its mechanism uses: the only ones a run stores."""


@dataclass(frozen=True)
class GossipSection:
    """How gossip peers pick neighbours, exchange and mix."""

    fanout: int = setting(4, "Gossip: neighbours each peer offers its model to per round.",
                          minimum=1)
    mix: str = setting(
        "clipped", "Gossip mixing: clipped (robust, the default: each neighbour's difference "
        "clipped, its example count capped at the median), pairwise (push-pull, "
        "example-weighted, the network's weighted sum exact) or trimmed (coordinate-wise).",
        choices=("pairwise", "clipped", "trimmed"),
    )
    clip_tau: float | None = setting(
        None, "Gossip --mix clipped: clipping radius (default: adaptive).", above=0
    )
    trim_fraction: float = setting(
        0.2, "Gossip --mix trimmed: share trimmed at each end.", minimum=0, maximum=0.49
    )
    group_exchange: bool = setting(
        False, "Gossip pairwise: average with all of a round's neighbours at once."
    )
    example_ratio: float = setting(
        10.0, "Gossip: a neighbour's stated example count weighs at most this many "
        "times this peer's own (its word is bounded, not trusted).", minimum=1,
    )
    distance_factor: float = setting(
        5.0, "Gossip: refuse a neighbour's model farther from ours than this many times the "
        "90th percentile of the last 32 accepted distances (0: only the fixed limit of 100 "
        "model lengths).", minimum=0,
    )
    round_interval: float | None = setting(
        None,
        "Gossip slot length in seconds: peers train together, then mix. Default: agreed by "
        "the peers from their measured round times; 0: rounds back to back.",
        minimum=0, identity=False,
    )
    exchange_timeout: float = setting(
        5.0, "Gossip: seconds to wait for a neighbour's reply.", above=0, identity=False
    )
    drop_after: int = setting(
        3, "Gossip: missed deadlines before a neighbour is dropped.", minimum=1, identity=False
    )
    max_message_mb: int = setting(
        1024, "Gossip: largest accepted message, MiB.", minimum=1, identity=False
    )
    wait_for_peers: int = setting(
        2, "Gossip: before round 1, wait (at most --connect-timeout) until this many peers, "
        "this one included, are live; the default 2 waits for one other. 1: start at once, "
        "alone.", minimum=1, identity=False,
    )
    seed_timeout: float = setting(
        30.0, "Gossip: seconds for a seed to answer before the peer stops, naming it.",
        above=0, identity=False,
    )
    linger: float = setting(
        120.0, "Gossip: after the last round, keep answering other peers' offers until every "
        "live peer has finished its rounds too (or left), at most this many seconds (0: leave "
        "at once).", minimum=0, identity=False,
    )
    max_alone: float = setting(
        0.2, "Gossip: share of rounds a peer may train without mixing with anyone; above it "
        "the run ends 'completed-alone' (exit code 3), not 'completed'.", minimum=0, maximum=1,
        identity=False,
    )
    checkpoint_every: int = setting(
        10, "Gossip: write the peer's model as a checkpoint every this many rounds (and after "
        "the last one); 0: only after the last.", minimum=0, identity=False,
    )


DEFAULT_DB_URL = "sqlite:///fedweave.db"
"""Used when no ``--db`` / ``url`` is given: an embedded SQLite file in the working directory.
Declared beside its option (not in ``fedweave.history``, which reads the config's names: the
two packages must not import each other)."""

DB_URL_ENVVAR = "FEDWEAVE_DB"
"""Environment variable the CLI reads for ``--db`` when the flag is not given."""


@dataclass(frozen=True)
class HistoryConfigSection:
    """Where runs, rounds and checkpoints are recorded."""

    db: str = setting(
        DEFAULT_DB_URL,
        "History database URL: sqlite:///FILE or postgresql+psycopg://USER:PASS@HOST/DB "
        "('none': record nothing, gossip peers only).",
        envvar=DB_URL_ENVVAR, identity=False, stored=False,
    )
    checkpoint_dir: Path = setting(
        Path("checkpoints"), "Where each round's global model file is kept.", identity=False
    )
    db_outage: float = setting(
        300.0, "Seconds a deployed run rides out an unreachable history database (a restart, "
        "a failover): rounds go on and wait to be recorded, retried with backoff; longer, "
        "and the run ends (resumable with --resume).", above=0, identity=False,
    )
    resume: str | None = setting(
        None,
        "Continue run RUN_ID (or 'latest') after its last recorded round, with its recorded "
        "config (a gossip peer: its own run, from its last checkpoint).",
        identity=False, stored=False,
    )
    track: str | None = setting(
        None, "Also log round metrics to mlflow or tensorboard (needs that package).",
        choices=("mlflow", "tensorboard"), identity=False,
    )


@dataclass(frozen=True)
class SimulationSection:
    """Many sites on this machine."""

    mode: str = setting(
        "federated", "federated (Flower + FedAvg) or gossip (ZeroMQ peers).",
        choices=("federated", "gossip"),
    )
    gpus_per_client: float = setting(
        0.0, "Federated: GPU share per simulated site (0.25 = four sites per GPU).", minimum=0,
        identity=False,
    )
    gpus_per_peer: float = setting(
        0.0, "Gossip: GPU share per peer (0.5 = two per GPU).", minimum=0, identity=False
    )
    site_speeds: str | None = setting(
        None, "Federated: sites of unequal speed on a simulated clock: equal, lognormal:SIGMA or "
        "pareto:ALPHA (each site's compute and link factor, fixed by --seed and its name); "
        "each round records its simulated seconds. Default: no simulated clock.",
    )
    simulated_deadline: float | None = setting(
        None, "Federated, with --site-speeds: a synchronous round closes this many simulated "
        "seconds after it starts; slower sites are late (fedprox counts the part they did). "
        "Default: rounds wait for their slowest site.", above=0,
    )
    stragglers: float = setting(
        0.0, "Federated: share of each round's sampled sites that are stragglers and finish only "
        "a random part of their local work by the deadline (FedProx paper): fedprox counts "
        "their partial work, every other strategy drops them as late.",
        minimum=0, below=1,
    )
    ray_address: str | None = setting(
        None, "Federated: run the simulated sites on the Ray cluster already running at this "
        "address (its head's HOST:PORT, as `ray start --head` prints it; `auto`: the cluster "
        "started on this machine). Default: the cluster Ray's RAY_ADDRESS names, else a "
        "private Ray instance on this machine. Every "
        "node needs the same Python environment, and --split-dir on storage they all mount.",
        identity=False,
    )
    split_dir: Path | None = setting(
        None, "Where the per-site data files and the held-out test.npz are written (default: a "
        "temporary directory, removed after the run). On a Ray cluster of several machines, a "
        "directory every node mounts at this same path.", identity=False,
    )
    kill: str | None = setting(
        None, "Gossip fault injection: FRACTION@ROUND, e.g. 0.3@10 kills 30% of peers at "
        "round 10.",
    )
    out: Path = setting(Path("report.json"), "Where the JSON report is written.",
                        identity=False)


@dataclass(frozen=True)
class ConnectionSection:
    """TLS and site authentication between sites and the coordinator."""

    insecure: bool = setting(
        False, "No TLS (testing only; TLS is on by default). Gossip: no CURVE between peers "
        "(plaintext, unauthenticated; CURVE is on by default).", identity=False
    )
    tls_dir: Path | None = setting(
        None, "Coordinator: directory from `fedweave certs init` (ca.pem, server.pem, "
        "server.key, sites/).", identity=False, stored=False,
    )
    ca_cert: Path | None = setting(
        None, "Site: the coordinator's ca.pem (TLS is on by default).", identity=False,
        stored=False,
    )
    site_key: Path | None = setting(
        None, "Site: its private key (`fedweave sites new-key`), when the coordinator "
        "requires registered sites.", identity=False, stored=False,
    )
    allow_unregistered_sites: bool = setting(
        False, "Coordinator: admit any site that holds the CA certificate. By default (with "
        "TLS) only sites whose key was added with `fedweave sites add-key` are admitted.",
        identity=False,
    )
    connect_timeout: float = setting(
        300.0, "Give up after this many seconds without reaching the coordinator (a site), or "
        "without --wait-for-peers peers live (a gossip peer).", above=0, identity=False,
    )


@dataclass(frozen=True)
class DeploymentSection:
    """The coordinator as a server."""

    address: str = setting(
        "0.0.0.0:9092", "HOST:PORT sites connect to (0.0.0.0 for all interfaces).",
        identity=False,
    )
    state_dir: Path = setting(
        Path("coordinator-state"), "Where the SuperLink's log is written.",
        identity=False,
    )
    site_timeout: float = setting(
        0.0, "Give up if --min-clients sites are not connected after this many seconds "
        "(0: wait forever).", minimum=0, identity=False,
    )
    wait_for_sites: float = setting(
        900.0, "Once the run has started, seconds a round waits while fewer than "
        "--min-clients sites are connected (saying so, and which are missing); then the run "
        "ends interrupted, resumable with --resume.", above=0, identity=False,
    )
    max_clock_skew: float = setting(
        60.0, "Seconds a site's clock may differ from the coordinator's; a site further off "
        "is refused every round with the difference it measured, recorded failed, and the "
        "round goes on. (With site keys Flower itself refuses requests signed more than 5 s "
        "ahead or 305 s behind its clock.)",
        above=0, identity=False,
    )
    once: bool = setting(
        False, "Exit (0) when the run completes instead of serving on.", identity=False,
        stored=False,
    )
    bulk_address: str | None = setting(
        None, "Move the model and the sites' updates over HTTPS at HOST:PORT, beside Flower's "
        "messages (a site connects to the host it reaches the coordinator at, on this port; "
        "each transfer needs the token its round's message carries); for large models. "
        "Unset: through Flower.", identity=False,
    )
    operator_address: str | None = setting(
        None, "Open the operator door at HOST:PORT (HTTPS with the coordinator's certificate): "
        "operators with a token from `fedweave operators add` submit, follow and stop studies "
        "(`fedweave run`), run as they come once the command line's run has ended, up to "
        "--max-studies at once. Unset: no door.", identity=False,
    )
    max_studies: int = setting(
        2, "With --operator-address: the most operators' studies run at once; the next waits "
        "its turn in the queue. Studies at once share the sites: a site trains one message "
        "at a time, whichever study sent it.", minimum=1, maximum=16, identity=False,
        stored=False,
    )
    study_files: Path | None = setting(
        None, "With --operator-address: the one folder whose files studies may name "
        "([data] test_data, [training] initial_model; relative to it or inside it, links "
        "resolved). Unset: a study names no file. Anything else is refused without saying "
        "whether it exists.", identity=False, stored=False,
    )
    study_max_rounds: int = setting(
        500, "With --operator-address: the most --rounds a study may ask for; more is refused "
        "at submission.", minimum=1, identity=False, stored=False,
    )
    study_max_local_epochs: int = setting(
        20, "With --operator-address: the most local epochs a study may ask of a site a "
        "round; more is refused at submission.", minimum=1, identity=False, stored=False,
    )
    study_max_batch_size: int = setting(
        4096, "With --operator-address: the largest local batch a study may ask for.",
        minimum=1, identity=False, stored=False,
    )
    study_max_round_timeout: float = setting(
        3600.0, "With --operator-address: the longest round deadline (seconds) a study may "
        "set.", above=0, identity=False, stored=False,
    )
    study_max_workers: int = setting(
        4, "With --operator-address: the most data-loading workers a study may ask a site "
        "for.", minimum=0, identity=False, stored=False,
    )
    studies_only: bool = setting(
        False, "With --operator-address: run no study of the command line's own (its --task and "
        "training options are unused); serve the sites and the operators' studies only.",
        identity=False, stored=False,
    )


@dataclass(frozen=True)
class SiteSection:
    """One data-holding site of a deployment."""

    coordinator: str | None = setting(
        None, "The coordinator's HOST:PORT (required).", required=True, identity=False
    )
    name: str | None = setting(
        None, "This site's name in the coordinator's history (default: its --site-key file's "
        "name, else the host name); two live sites with one name are reported. A coordinator "
        "with site keys records the name the key is registered under.",
        identity=False,
    )
    runtime_port: int = setting(
        0, "Local port of the SuperNode's runtime API (0: any free port).", minimum=0,
        maximum=65535, identity=False,
    )
    log_file: Path = setting(Path("site.log"), "Where the SuperNode's full log goes.",
                             identity=False)
    require_secure_agg: bool = setting(
        False, "Train only in rounds whose update SecAgg+ masks (or holds for a SecAgg+ "
        "buffer); refuse the others, with the reason, before training.", identity=False,
    )
    require_dp: str = setting(
        "off", "Differential privacy this site requires of a run, refused otherwise before "
        "training: off; any (central, local or sample); local (this site noises its own "
        "update: local or sample); sample (per-example DP-SGD here).",
        choices=("off", "any", "local", "sample"), identity=False,
    )
    max_delta: float | None = setting(
        None, "The most delta this site lets a DP run state its epsilon at; a round asking "
        "for more is refused (default: 1 / (10 x this site's training examples)).",
        above=0, maximum=0.5, identity=False,
    )
    base_model: Path | None = setting(
        None, "--peft lora runs: this site's copy of the run's frozen base model (its "
        "--initial-model, a .safetensors file), checked against the sha256 the run pinned; "
        "the base never travels.", identity=False,
    )
    privacy_ledger: Path | None = setting(
        None, "Where this site keeps its own sample-level DP ledger (--dp sample runs): every "
        "DP-SGD step its data went through, across runs and restarts; the epsilon it reports "
        "is read from it (default: DATA.privacy-ledger.json beside its --data file).",
        identity=False,
    )
    more_tasks: str = setting(
        "", "Other tasks this site holds beside --task, each with its own data file: "
        "TASK=DATA[,TASK=DATA...] (e.g. heart=heart.csv,xray=xrays.npz). The site serves a run "
        "of any task it holds, reading that task's file (a CSV's labels in the task's own "
        "label column; its DP ledger and personal layers beside it); --label-column, --columns, "
        "--eval-data, --privacy-ledger and --personal-state are --task's.",
        identity=False,
    )
    policy: Path | None = setting(
        None, "This site's policy file (TOML): the tasks, operators and UTC hours it takes runs "
        "of, and a privacy floor; a run it does not take is refused at its first message, with "
        "the reason, which the coordinator records. Read again whenever it changes. See "
        "docs/deploy.md, \"What each site takes part in\".", identity=False,
    )
    personal_state: Path | None = setting(
        None, "Where this site keeps the local layers of a task that declares them "
        "(local_layers: a personal head, never sent), one file a run, across rounds and "
        "restarts (default: the folder DATA.personal beside its --data file).",
        identity=False,
    )


@dataclass(frozen=True)
class PeerSection:
    """One gossip peer."""

    listen: str | None = setting(
        None, "Endpoint to listen on, tcp://HOST:PORT (required).", required=True,
        identity=False,
    )
    advertise: str | None = setting(
        None,
        "Endpoint other peers dial, tcp://HOST:PORT with this host's address or name "
        "(default: the --listen endpoint; required when --listen is a wildcard like 0.0.0.0).",
        identity=False,
    )
    seeds: str = setting(
        "", "Comma-separated seeds: tcp://A:P or PEERID@tcp://A:P.", identity=False
    )
    keys: Path | None = setting(
        None, "CURVE key directory (`fedweave keys new`); default ./peer-keys, made on first "
        "start. Peers are allowed by copying their peer.key into DIR/allowed/.",
        identity=False, stored=False,
    )
    threads: int = setting(1, "torch CPU threads (0 keeps torch's default).", minimum=0,
                           identity=False)
    log_level: str = setting(
        "info", "Log level.", choices=("debug", "info", "warning"), identity=False
    )
    run_id: str | None = setting(None, "Write into this history run.", hidden=True,
                                 identity=False, stored=False)
    results: Path | None = setting(None, "JSON-lines results (simulation).", hidden=True,
                                   identity=False, stored=False)
    dump_models: Path | None = setting(None, "Per-round model dumps.", hidden=True,
                                       identity=False, stored=False)


@dataclass(frozen=True)
class MonitoringSection:
    """What an operator can watch live: Prometheus metrics, stall warnings, a site's view."""

    metrics_address: str | None = setting(
        None, "Coordinator: serve this run's Prometheus /metrics at HOST:PORT (loopback; any "
        "other address needs --tls-dir and --auth-file).", identity=False, stored=False,
    )
    auth_file: Path | None = setting(
        None, "Credentials (`fedweave dashboard add-credential`) a web endpoint on a "
        "non-loopback address asks for (HTTP basic auth or a bearer token).",
        identity=False, stored=False,
    )
    stall_after: int = setting(
        3, "Warn when a site is recorded late this many rounds in a row (0: never).",
        minimum=0, identity=False, stored=False,
    )
    stall_grace: float = setting(
        60.0, "Warn when a round has run this many seconds past its training and evaluation "
        "deadlines.", minimum=0, identity=False, stored=False,
    )
    status_address: str | None = setting(
        None, "Site: serve what this site contributed (rounds, examples, its metrics, its "
        "refused or rejected work) at HOST:PORT, a loopback address.",
        identity=False, stored=False,
    )


@dataclass(frozen=True)
class OutputSection:
    """What the command shows."""

    verbose: bool = setting(
        False, "Show Flower's own logs (and Ray's, in simulation).", identity=False,
        stored=False,
    )


SECTIONS: dict[str, type] = {
    "data": DataSection,
    "training": TrainingSection,
    "federation": FederationSection,
    "evaluation": EvaluationSection,
    "secure_aggregation": SecureAggregationSection,
    "privacy": PrivacySection,
    "gossip": GossipSection,
    "history": HistoryConfigSection,
    "simulation": SimulationSection,
    "connection": ConnectionSection,
    "deployment": DeploymentSection,
    "site": SiteSection,
    "peer": PeerSection,
    "monitoring": MonitoringSection,
    "output": OutputSection,
}
"""Config-file section name → its dataclass, in the order ``--help`` and TOML show them."""

_TRAINING = (
    "rounds", "local_epochs", "optimizer", "lr", "weight_decay", "clip_grad_norm", "batch_size",
    "seed", "device", "num_workers",
)  # fmt: skip
"""Every training setting; the task declares the defaults of those it names
(``fedweave/config/task_defaults.py``)."""
_ADAPTER = ("peft", "lora_rank", "lora_alpha", "lora_targets")
"""Adapters only (``fedweave/learning/adapters.py``)."""
_SPLIT = ("task", "clients", "partition", "alpha", "shards_per_client")
_FEDERATION = (
    "clients_per_round", "strategy", "proximal_mu", "max_update_norm", "compress", "downlink",
    "round_timeout", "min_replies",
)  # fmt: skip
_ASYNC = ("schedule", "buffer", "max_staleness", "server_lr")
_SCHEDULE = (*_ASYNC, "site_speeds", "simulated_deadline")
_SECAGG = ("secure_agg", "secagg_timeout")
_EVALUATION = (
    "fraction_evaluate", "evaluate_every", "cross_site", "private_evaluation", "select_metric",
    "select_mode",
)  # fmt: skip
_PRIVACY = (
    "dp", "noise_multiplier", "clipping_norm", "dp_epsilon", "dp_delta", "target_epsilon",
    "max_epsilon",
)

COMMAND_SETTINGS: dict[str, tuple[str, ...]] = {
    "simulate": (
        "mode", *_SPLIT, "data_dir", "test_data", *_TRAINING, *_FEDERATION, *_SCHEDULE,
        *_EVALUATION, "eval_fraction", *_SECAGG, *_PRIVACY,
        "stragglers", "fanout", "mix", "group_exchange", "round_interval", "exchange_timeout",
        "kill", "insecure",
        "gpus_per_client", "gpus_per_peer", "ray_address", "split_dir", "out", "db",
        "checkpoint_dir", "resume", "track", "verbose", "initial_model", *_ADAPTER,
    ),
    "coordinator": (
        "task", "test_data", "label_column", *_TRAINING, "initial_model", *_ADAPTER,
        "min_clients", "sites",
        *_FEDERATION, *_ASYNC,
        *_EVALUATION, *_SECAGG, *_PRIVACY,
        "address", "insecure", "tls_dir", "allow_unregistered_sites", "site_timeout",
        "wait_for_sites", "max_clock_skew", "state_dir", "once", "bulk_address",
        "operator_address", "max_studies",
        "study_files", "study_max_rounds", "study_max_local_epochs", "study_max_batch_size",
        "study_max_round_timeout", "study_max_workers", "studies_only", "db", "db_outage",
        "checkpoint_dir", "resume",
        "track", "metrics_address", "auth_file", "stall_after", "stall_grace",
    ),
    "evaluate": (
        "run", "min_clients", "round_timeout", "batch_size", "device", "address", "insecure",
        "tls_dir", "allow_unregistered_sites", "site_timeout", "state_dir", "db",
        "checkpoint_dir",
    ),
    "client": (
        "coordinator", "name", "task", "data", "label_column", "columns", "eval_data",
        "eval_fraction", "device", "nproc_per_node", "insecure", "ca_cert",
        "site_key", "connect_timeout", "runtime_port", "log_file", "status_address", "verbose",
        "require_secure_agg", "require_dp", "max_epsilon", "max_delta", "privacy_ledger",
        "base_model", "personal_state", "more_tasks", "policy",
    ),
    "peer": (
        "listen", "advertise", "seeds", "task", "data", "label_column", "test_data", *_TRAINING,
        "nproc_per_node",
        "initial_model", *_ADAPTER,
        "fanout", "mix", "clip_tau", "trim_fraction", "group_exchange", "example_ratio",
        "distance_factor", "round_interval", "exchange_timeout", "drop_after", "max_message_mb",
        "compress", "wait_for_peers", "seed_timeout", "linger", "max_alone", "checkpoint_every",
        "connect_timeout", "keys", "insecure", "threads", "log_level", "db", "checkpoint_dir",
        "resume",
        "run_id", "results", "dump_models",
    ),
    "data split": (*_SPLIT, "seed"),
}  # fmt: skip
"""Command → the settings it takes; ``tests/test_config.py`` holds every command to it."""
