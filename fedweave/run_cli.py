"""``fedweave run submit|list|show|logs|stop``: an operator's commands against a serving
coordinator's operator door (``fedweave coordinator --operator-address``; issue 38).

Every command needs the door's address, the federation's CA certificate (the door serves
HTTPS with the coordinator's certificate) and the operator's token file from ``fedweave
operators add``. Mounted in ``fedweave/cli.py`` as ``app.add_typer(run_app, name="run")``.
Only the standard library is used; every failure ends as ``error: <one line>`` and exit 2.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from fedweave.errors import UserError, user_errors_as_one_line

MAX_RESPONSE_BYTES = 8 << 20
"""The most a reply of the door may hold (a list of every submission, the rounds' lines)."""
TIMEOUT_S = 60.0
"""How long one request may take (a submission is checked as the coordinator checks its own
run: the task loaded, the test data read)."""
FOLLOW_EVERY_S = 2.0

run_app = typer.Typer(
    help="An operator's studies at a serving coordinator (its --operator-address): submit, "
    "list, show, follow and stop them.",
    no_args_is_help=True,
)

DoorOption = Annotated[
    str,
    typer.Option(
        "--coordinator",
        envvar="FEDWEAVE_OPERATOR_DOOR",
        help="The coordinator's operator door, HOST:PORT (its --operator-address).",
        show_default=False,
    ),
]
CaOption = Annotated[
    Path | None,
    typer.Option(
        "--ca-cert",
        envvar="FEDWEAVE_CA_CERT",
        help="The federation's CA certificate (ca.pem), which signed the coordinator's.",
    ),
]
TokenOption = Annotated[
    Path,
    typer.Option(
        "--operator-token",
        envvar="FEDWEAVE_OPERATOR_TOKEN",
        help="The file `fedweave operators add` wrote for you.",
        show_default=False,
    ),
]
InsecureOption = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Plain HTTP, for a door on the coordinator's own loopback started with --insecure.",
    ),
]
NumberArg = Annotated[int, typer.Argument(help="The submission's number (`fedweave run list`).")]


class Door:
    """Requests to one operator door, with the operator's token."""

    def __init__(self, address: str, ca_cert: Path | None, token_file: Path, insecure: bool):
        from fedweave.addresses import parse_host_port
        from fedweave.history.operators import TOKEN_PREFIX

        self.host, self.port = parse_host_port(address, "--coordinator")
        self.address = address
        try:
            self.token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(
                f"cannot read the operator token {token_file} ({exc}); pass the file "
                "`fedweave operators add` wrote (--operator-token)"
            ) from None
        if not (self.token.startswith(TOKEN_PREFIX) and self.token.isascii()
                and self.token.isprintable() and " " not in self.token):  # fmt: skip
            raise UserError(
                f"{token_file} holds no operator token; pass the file `fedweave operators "
                "add` wrote (--operator-token)"
            )
        self.context = None
        if not insecure:
            if ca_cert is None:
                raise UserError("--ca-cert is required (the federation's ca.pem), or --insecure")
            try:
                self.context = ssl.create_default_context(cafile=str(ca_cert))
            except (OSError, ssl.SSLError) as exc:
                raise UserError(f"cannot read the CA certificate {ca_cert} ({exc})") from None

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
        """The door's JSON reply; its error line as a ``UserError``."""
        if self.context is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
        else:
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=TIMEOUT_S, context=self.context
            )
        try:
            conn.request(method, path, body=body, headers={
                "authorization": f"Bearer {self.token}", **(headers or {}),
            })  # fmt: skip
            response = conn.getresponse()
            data = response.read(MAX_RESPONSE_BYTES + 1)
        except ssl.SSLCertVerificationError as exc:
            raise UserError(
                f"the coordinator at {self.address} is not who --ca-cert vouches for "
                f"({exc.verify_message}); check the address and the CA certificate"
            ) from None
        except (OSError, http.client.HTTPException) as exc:  # timeouts are OSErrors
            raise UserError(
                f"cannot reach the operator door at {self.address} ({exc}); check the "
                "address and that the coordinator runs with --operator-address"
            ) from None
        finally:
            conn.close()
        if len(data) > MAX_RESPONSE_BYTES:
            raise UserError(f"the reply of {self.address} is larger than it may be")
        try:
            reply = json.loads(data)
        except ValueError:
            raise UserError(
                f"{self.address} did not answer as an operator door (HTTP {response.status}); "
                "check the address (the coordinator's --operator-address)"
            ) from None
        if response.status >= 400 or not isinstance(reply, dict):
            error = reply.get("error") if isinstance(reply, dict) else None
            raise UserError(str(error or f"the door answered HTTP {response.status}"))
        return reply


def _door(coordinator: str, ca_cert: Path | None, token: Path, insecure: bool) -> Door:
    return Door(coordinator, ca_cert, token, insecure)


def _when(text: str | None) -> str:
    return (text or "")[:19].replace("T", " ")


@run_app.command("submit")
def run_submit(
    config: Annotated[Path, typer.Option("--config", help="The study: a TOML file of settings.")],
    coordinator: DoorOption,
    operator_token: TokenOption,
    ca_cert: CaOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Submit a study (checked as `fedweave coordinator --config` is), queued behind the others."""
    with user_errors_as_one_line():
        try:
            body = config.read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read {config} ({exc.strerror or exc})") from None
        door = _door(coordinator, ca_cert, operator_token, insecure)
        reply = door.request("POST", "/v1/runs", body, {"x-fedweave-source": config.name})
    ahead = int(reply.get("ahead", 0))
    number = reply.get("submission")
    typer.echo(
        f"submitted as {number}"
        + (f" ({ahead} ahead of it)" if ahead else " (next)")
        + f"; follow it with `fedweave run logs {number} --follow`"
    )


@run_app.command("list")
def run_list(
    coordinator: DoorOption,
    operator_token: TokenOption,
    ca_cert: CaOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Every submission: its state, who submitted it, its history run, why it ended."""
    with user_errors_as_one_line():
        reply = _door(coordinator, ca_cert, operator_token, insecure).request("GET", "/v1/runs")
    rows = reply.get("submissions") or []
    if not rows:
        typer.echo("no submissions yet; `fedweave run submit --config study.toml` queues one")
        return
    for row in rows:
        typer.echo(
            f"{row['id']:>4}  {row['state']:<9}  {_when(row['submitted_at'])}  "
            f"{row['operator']}  {row['source']}  run {row.get('run_id') or '-'}"
            + (f"  ({row['reason']})" if row.get("reason") else "")
        )


@run_app.command("show")
def run_show(
    number: NumberArg,
    coordinator: DoorOption,
    operator_token: TokenOption,
    ca_cert: CaOption = None,
    insecure: InsecureOption = False,
) -> None:
    """One submission: its state, its history run and the study it was given."""
    with user_errors_as_one_line():
        door = _door(coordinator, ca_cert, operator_token, insecure)
        row = door.request("GET", f"/v1/runs/{number}")
    typer.echo(f"submission {row['id']}: {row['state']}"
               + (f", {row['ahead']} ahead of it" if "ahead" in row else "")
               + (f" ({row['reason']})" if row.get("reason") else ""))  # fmt: skip
    typer.echo(f"submitted {_when(row['submitted_at'])} by {row['operator']} ({row['source']})")
    run = row.get("run")
    if run:
        typer.echo(f"history run {row['run_id']}: {run['status']}, {run['rounds']} rounds"
                   + (f" ({run['reason']})" if run.get("reason") else ""))  # fmt: skip
    typer.echo("study:")
    for line in str(row.get("config", "")).splitlines():
        typer.echo(f"  {line}")


@run_app.command("logs")
def run_logs(
    number: NumberArg,
    coordinator: DoorOption,
    operator_token: TokenOption,
    ca_cert: CaOption = None,
    insecure: InsecureOption = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing rounds until it ends.")
    ] = False,
) -> None:
    """A submission's rounds as the coordinator's console prints them."""
    with user_errors_as_one_line():
        door = _door(coordinator, ca_cert, operator_token, insecure)
        after = 0
        while True:
            reply = door.request("GET", f"/v1/runs/{number}/logs?after={after}")
            for line in reply.get("lines") or ():
                typer.echo(line)
            after = int(reply.get("after", after))
            state = reply.get("state")
            if not follow or state in ("completed", "stopped", "failed"):
                break
            time.sleep(FOLLOW_EVERY_S)
    typer.echo(f"submission {number}: {state}"
               + (f" ({reply['reason']})" if reply.get("reason") else ""))  # fmt: skip


@run_app.command("stop")
def run_stop(
    number: NumberArg,
    coordinator: DoorOption,
    operator_token: TokenOption,
    ca_cert: CaOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Stop a submission: a queued one never runs; a running one stops, its rounds kept."""
    with user_errors_as_one_line():
        door = _door(coordinator, ca_cert, operator_token, insecure)
        reply = door.request("POST", f"/v1/runs/{number}/stop")
    was = reply.get("was")
    typer.echo(
        f"submission {number} stopped before it started"
        if was == "queued"
        else f"submission {number} is being stopped; `fedweave run show {number}` says when"
    )
