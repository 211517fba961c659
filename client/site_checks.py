"""``fedweave client``'s checks of what its options name, before it connects: the coordinator's
address, the data files (read once, as training will read them), the CA certificate and the
site key.

What the options alone decide (``--insecure`` or ``--ca-cert``, bounds, choices) is checked
when the options are resolved (``fedweave/config/commands.check_settings``,
``fedweave/config/rules.py``). Every refusal is a one-line ``UserError``.
"""

from __future__ import annotations

from pathlib import Path

from fedweave.addresses import parse_host_port
from fedweave.config import RunConfig
from fedweave.errors import UserError


def check_site_inputs(config: RunConfig) -> None:
    """One-line errors for everything checkable before connecting."""
    from fedweave.learning.data import load_site_data
    from fedweave.learning.tasks import load_task

    data, connection = config.data, config.connection
    if data.data is None:
        raise UserError("--data is required: this site's .npz or .csv file")
    parse_host_port(config.site.coordinator or "", "--coordinator", "coord.example.org:9092")
    task = load_task(data.task)
    for flag, path in (("--data", data.data), ("--eval-data", config.evaluation.eval_data)):
        if path is None:
            continue
        if "'" in str(path):  # the SuperNode's node config quotes it
            raise UserError(f"{flag} path {path} contains a single quote; rename or move the file")
        load_site_data(path, task, data.label_column)  # missing/bad file: clear error here
    if not connection.insecure and connection.ca_cert is not None:
        _check_ca_cert(connection.ca_cert)
    if connection.site_key is not None:
        _check_site_key(connection.site_key)


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
