"""The operator door of a serving coordinator (``--operator-address``; issue 38): operators
submit studies, list and follow them, and stop them, over HTTPS with a token.

Every request needs ``Authorization: Bearer TOKEN``, the coordinator's own machine included;
the token is looked up (by its sha256) in the history's operators on every request, so
``fedweave operators remove`` takes effect at the next one. Refusals are audited with the
caller's address (an unknown token by the first 12 hex digits of its sha256) and slow a
source's unknown tokens down after a few (``FailedLogins``, as the dashboard's); a valid
token is served whatever else came from its address. A submission is checked as
the coordinator checks its own command line (``study.resolve_study``, the run's input) and
refused with the same one line; an accepted one is queued in the history
(``fedweave/history/submissions.py``) and audited, and so is a stop.

The routes (JSON; an error is ``{"error": "one line"}``):

- ``POST /v1/runs`` (the study's TOML as the body, at most ``MAX_CONFIG_BYTES``; header
  ``X-Fedweave-Source``: its file name) → 201 ``{"submission": N, "ahead": K}``;
- ``GET /v1/runs`` → ``{"submissions": [...]}``;
- ``GET /v1/runs/N`` → the submission and, once it runs, its history run;
- ``GET /v1/runs/N/logs?after=R`` → its rounds after round R as the console prints them;
- ``POST /v1/runs/N/stop`` → ``{"was": "queued"|"running"}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fedweave.dashboard.app import json_response
from fedweave.dashboard.security import FailedLogins
from fedweave.errors import UserError
from fedweave.history.operators import OperatorRegistry, token_sha256
from fedweave.history.submissions import MAX_CONFIG_BYTES, Submissions

BODY_SECONDS = 30.0
"""The longest a submission's body may take to arrive."""
ROLE_WORDS = {"submit": "submit studies"}
"""A role a whole route needs → what it allows, for the refusal."""


def _unseen(number: int) -> str:
    """What an operator is told of a submission it may not read: the same as of none."""
    return f"no submission {number}; `fedweave run list` shows them"


def _error(status: int, line: str, headers: dict[str, str] | None = None) -> Response:
    response = json_response({"error": line}, status)
    response.headers.update(headers or {})
    return response


async def _body(request: Request) -> bytes | None:
    """The request's body, or None where it is larger than ``MAX_CONFIG_BYTES``; at most
    ``BODY_SECONDS`` to arrive (``TimeoutError``)."""

    async def read() -> bytes | None:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_CONFIG_BYTES:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    return await asyncio.wait_for(read(), BODY_SECONDS)


def make_door(
    store,  # type: ignore[no-untyped-def]
    check_study: Callable[[str, str, Any], None],
    round_lines: Callable[[str, int], tuple[list[str], int]],
) -> Starlette:
    """The door's app over the history ``store``. ``check_study(text, source, operator)``
    raises a ``UserError`` for a study the coordinator would refuse from that operator (an
    ``OperatorInfo``); ``round_lines(run_id, after)``
    gives a history run's rounds after ``after`` as the console prints them, and the last
    of those rounds (``after`` where there are none), read at once."""
    operators, submissions = OperatorRegistry(store), Submissions(store)
    failed = FailedLogins()

    async def caller(
        request: Request, role: str | None = None
    ) -> tuple[str | None, Response | None]:
        """The operator the request's token names, or the refusal to send (also where the
        operator does not hold ``role``)."""
        source = request.client.host if request.client else None
        address = f"{source}:{request.client.port}" if request.client else None
        action = f"{request.method} {request.url.path}"[:64]
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        holder = None
        if scheme.lower() == "bearer" and token:
            holder = await run_in_threadpool(operators.holder, token)
        name = holder.name if holder is not None else None
        # the lockout is for what a caller presents: a valid token passes whatever others
        # from the same address tried, so no one without a token can lock an operator out
        wait = failed.wait(source, None) if name is None else 0
        if wait > 0:
            line = f"too many refused tokens from {source}; try again in {wait:.0f} s"
            return None, _error(429, line, {"retry-after": f"{wait:.0f}"})
        if name is None:
            failed.failed(source, None)
            shown = f"unknown token sha256:{token_sha256(token)[:12]}" if token else "no token"
            await run_in_threadpool(
                operators.record, shown, action, "refused", address=address,
                detail="no operator holds this token",
            )  # fmt: skip
            line = ("this coordinator does not know that operator token; ask its "
                    "administrator for one (fedweave operators add)")  # fmt: skip
            return None, _error(401, line)
        if role is not None and not holder.may(role):
            await run_in_threadpool(
                operators.record, name, action, "refused", address=address,
                detail=f"operator {name} does not hold the role {role}",
            )  # fmt: skip
            return None, _error(
                403, f"operator {name} may not {ROLE_WORDS[role]} (role {role}); ask the "
                "coordinator's administrator (fedweave operators roles)",
            )  # fmt: skip
        request.state.operator = holder
        return name, None

    def _may_see(request: Request, number: int) -> bool:
        """Whether the request's operator may read submission ``number``: its own, or any
        with ``read-all``."""
        holder = request.state.operator
        return holder.may("read-all") or submissions.get(number).operator == holder.name

    def _submission(request: Request) -> int | None:
        try:
            return int(request.path_params["number"])
        except (KeyError, ValueError):
            return None

    async def submit(request: Request) -> Response:
        name, refusal = await caller(request, "submit")
        if refusal is not None:
            return refusal
        address = f"{request.client.host}:{request.client.port}" if request.client else None
        source = request.headers.get("x-fedweave-source", "study.toml")[:255] or "study.toml"

        async def refuse(status: int, line: str) -> Response:
            await run_in_threadpool(
                operators.record, name, "run-submit", "refused", address=address,
                target=source, detail=line,
            )  # fmt: skip
            return _error(status, line)

        try:
            body = await _body(request)
        except TimeoutError:
            return await refuse(408, f"the study took more than {BODY_SECONDS:.0f} s to arrive")
        if body is None:
            return await refuse(413, f"a study is at most {MAX_CONFIG_BYTES // 1024} KB of TOML")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return await refuse(422, f"{source} is not UTF-8 text; send the study's TOML file")
        try:
            await run_in_threadpool(check_study, text, source, request.state.operator)
            number = await run_in_threadpool(submissions.submit, name, source, text)
        except UserError as exc:
            return await refuse(422, str(exc).splitlines()[0] if str(exc) else "refused")
        await run_in_threadpool(
            operators.record, name, "run-submit", "done", address=address,
            target=f"submission {number}", detail=source,
        )  # fmt: skip
        ahead = await run_in_threadpool(submissions.queue_position, number)
        return json_response({"submission": number, "ahead": ahead}, 201)

    async def listing(request: Request) -> Response:
        _name, refusal = await caller(request)
        if refusal is not None:
            return refusal
        rows = await run_in_threadpool(submissions.all)
        holder = request.state.operator
        if not holder.may("read-all"):
            rows = [row for row in rows if row.operator == holder.name]
        return json_response({"submissions": [row.as_dict() for row in rows]})

    def _show(number: int) -> dict[str, Any]:
        info = submissions.get(number)
        shown = info.as_dict()
        shown["config"] = info.config_toml
        if info.state == "queued":
            shown["ahead"] = submissions.queue_position(number)
        if info.run_id is not None:
            run = store.get_run(info.run_id)
            shown["run"] = {"status": run.status, "reason": run.reason,
                            "rounds": len(store.rounds(info.run_id))}  # fmt: skip
        return shown

    async def show(request: Request) -> Response:
        _name, refusal = await caller(request)
        if refusal is not None:
            return refusal
        number = _submission(request)
        if number is None:
            return _error(404, "a submission is a number; `fedweave run list` shows them")
        try:
            if not await run_in_threadpool(_may_see, request, number):
                return _error(404, _unseen(number))
            return json_response(await run_in_threadpool(_show, number))
        except UserError as exc:
            return _error(404, str(exc))

    def _logs(number: int, after: int) -> dict[str, Any]:
        info = submissions.get(number)  # its state first: an ended run has all its rounds
        lines, last = round_lines(info.run_id, after) if info.run_id else ([], after)
        return {"state": info.state, "lines": lines, "after": last, "reason": info.reason}

    async def logs(request: Request) -> Response:
        _name, refusal = await caller(request)
        if refusal is not None:
            return refusal
        number = _submission(request)
        try:
            after = max(0, int(request.query_params.get("after", "0")))
        except ValueError:
            return _error(400, "after= is a round number")
        if number is None:
            return _error(404, "a submission is a number; `fedweave run list` shows them")
        try:
            if not await run_in_threadpool(_may_see, request, number):
                return _error(404, _unseen(number))
            return json_response(await run_in_threadpool(_logs, number, after))
        except UserError as exc:
            return _error(404, str(exc))

    async def stop(request: Request) -> Response:
        name, refusal = await caller(request)
        if refusal is not None:
            return refusal
        address = f"{request.client.host}:{request.client.port}" if request.client else None
        number = _submission(request)
        if number is None:
            return _error(404, "a submission is a number; `fedweave run list` shows them")
        try:
            holder = request.state.operator
            owner = (await run_in_threadpool(submissions.get, number)).operator
            needed = "stop-own" if owner == name else "stop-all"
            if not holder.may(needed):
                seen = await run_in_threadpool(_may_see, request, number)
                raise UserError(
                    f"operator {name} may not stop {owner}'s study (role stop-all)" if seen
                    else _unseen(number)
                )
            was = await run_in_threadpool(submissions.request_stop, number, name)
        except UserError as exc:
            await run_in_threadpool(
                operators.record, name, "run-stop", "refused", address=address,
                target=f"submission {number}", detail=str(exc),
            )  # fmt: skip
            return _error(409, str(exc))
        await run_in_threadpool(
            operators.record, name, "run-stop", "done", address=address,
            target=f"submission {number}", detail=f"it was {was}",
        )  # fmt: skip
        return json_response({"was": was})

    return Starlette(routes=[
        Route("/v1/runs", submit, methods=["POST"]),
        Route("/v1/runs", listing, methods=["GET"]),
        Route("/v1/runs/{number}", show, methods=["GET"]),
        Route("/v1/runs/{number}/logs", logs, methods=["GET"]),
        Route("/v1/runs/{number}/stop", stop, methods=["POST"]),
    ])  # fmt: skip
