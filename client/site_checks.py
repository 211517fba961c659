"""``fedweave client``'s checks of what its options name, before it connects: the coordinator's
address, the data files' names, the CA certificate and the site key.

The task and the data files themselves are read by the site's ClientApp worker, which imports
torch and the task anyway: it reports ``ok`` or the problem before the SuperNode starts
(``fedweave.client.worker.INPUTS_PREFIX``), so this process never imports torch. Only a site
whose SuperNode runs its own ClientApp processes (no worker) reads them here
(``check_site_data``).

What the options alone decide (``--insecure`` or ``--ca-cert``, bounds, choices) is checked
when the options are resolved (``fedweave/config/commands.check_settings``,
``fedweave/config/rules.py``). Every refusal is a one-line ``UserError``.
"""

from __future__ import annotations

from pathlib import Path

from fedweave.addresses import parse_host_port
from fedweave.config import RunConfig
from fedweave.errors import UserError


def more_tasks(config: RunConfig) -> dict[str, Path]:
    """``--more-tasks`` as task → its data file; one-line errors for what it cannot say."""
    given = config.site.more_tasks.strip()
    tasks: dict[str, Path] = {}
    for entry in filter(None, (part.strip() for part in given.split(","))):
        task, equals, path = (part.strip() for part in entry.partition("="))
        if not equals or not task or not path:
            raise UserError(
                f"--more-tasks entry {entry!r} is not TASK=DATA; e.g. --more-tasks "
                "heart=heart.csv,xray=xrays.npz"
            )
        if task == config.data.task or task in tasks:
            raise UserError(f"--more-tasks names task {task!r} twice (with --task); name it once")
        if "'" in path or "=" in path:  # the SuperNode's node config quotes the entries
            raise UserError(f"--more-tasks path {path} contains ' or =; rename or move the file")
        if not Path(path).is_file():
            raise UserError(f"--more-tasks {task}={path}: no such file; pass {task}'s data file")
        tasks[task] = Path(path)
    return tasks


def check_site_inputs(config: RunConfig) -> None:
    """One-line errors for everything checkable before connecting without reading the task
    and the data (``check_site_data``, or the worker, reads those)."""
    data, connection = config.data, config.connection
    if data.data is None:
        raise UserError("--data is required: this site's .npz or .csv file")
    more_tasks(config)
    if config.site.policy is not None:
        from fedweave.site_policy import read_policy

        if "'" in str(config.site.policy):
            raise UserError(f"--policy path {config.site.policy} contains a single quote")
        read_policy(config.site.policy)
    parse_host_port(config.site.coordinator or "", "--coordinator", "coord.example.org:9092")
    for flag, path in (
        ("--data", data.data), ("--eval-data", config.evaluation.eval_data),
        ("--columns", data.columns), ("--base-model", config.site.base_model),
    ):  # fmt: skip
        if path is not None and "'" in str(path):  # the SuperNode's node config quotes it
            raise UserError(f"{flag} path {path} contains a single quote; rename or move the file")
    base = config.site.base_model
    if base is not None and not base.is_file():
        raise UserError(
            f"--base-model {base} does not exist; pass this site's copy of the run's base model "
            "(the coordinator's --initial-model)"
        )
    if data.columns is not None:  # the file itself; the worker checks it against the data
        from fedweave.learning.column_map import read_column_map

        read_column_map(data.columns)
    if not connection.insecure and connection.ca_cert is not None:
        _check_ca_cert(connection.ca_cert)
    if connection.site_key is not None:
        _check_site_key(connection.site_key)


def check_site_data(config: RunConfig) -> None:
    """The task loads and the data files read as training will read them, or a one-line
    error; for a site without a ClientApp worker (whose check this otherwise is)."""
    from fedweave.learning.data import load_site_data
    from fedweave.learning.site_processes import check_processes
    from fedweave.learning.tasks import load_task

    task = load_task(config.data.task)
    for path in (config.data.data, config.evaluation.eval_data):
        if path is not None:
            load_site_data(path, task, config.data.label_column, config.data.columns)
    check_processes(config.training.nproc_per_node, config.training.device, task)
    for name, path in more_tasks(config).items():
        other = load_task(name)
        load_site_data(path, other, None, None)
        check_processes(config.training.nproc_per_node, config.training.device, other)


def _check_ca_cert(ca_cert: Path) -> None:
    try:
        if b"BEGIN CERTIFICATE" not in ca_cert.read_bytes():
            raise UserError(f"{ca_cert} is not a PEM certificate; use the coordinator's ca.pem")
    except OSError as exc:
        raise UserError(f"cannot read --ca-cert {ca_cert} ({exc.strerror or exc})") from None


def _check_site_key(site_key: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    try:
        key = load_ssh_private_key(site_key.read_bytes(), None)
    except OSError as exc:
        raise UserError(f"cannot read --site-key {site_key} ({exc.strerror or exc})") from None
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise UserError(
            f"{site_key} is not a site key; make one with `fedweave sites new-key --out site.key`"
        )
