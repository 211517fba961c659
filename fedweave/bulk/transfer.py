"""A site's side of a direct transfer: fetch a blob, upload a reply's tensors (``server.py`` is
the coordinator's side).

The connection goes to the host the site already reaches its coordinator at, on the port the
instruction names, and verifies the coordinator's certificate with the site's CA as Flower's
connection does. Every read has a deadline (``IO_TIMEOUT_S`` a read, ``deadline_s`` the whole
transfer) and a size limit (a fetched blob must be exactly the size the instruction named, and
hash to its digest).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

IO_TIMEOUT_S = 30.0
"""Seconds one read or write may wait."""
MAX_ANSWER_BYTES = 64 << 10
"""The most of an upload's answer (or an error's) read."""
CHUNK = 1 << 20


class TransferError(Exception):
    """A transfer that did not complete: why, in one line."""


@dataclass(frozen=True)
class Link:
    """Where and how a site reaches its coordinator's transfer server.

    Attributes:
        host: the coordinator's host, as the site's ``--coordinator`` names it.
        port: the transfer server's port (from the instruction).
        token: this message's transfer token.
        ca_cert: the CA the coordinator's certificate verifies with (``None``: plain HTTP).
        deadline_s: seconds a whole transfer may take.
    """

    host: str
    port: int
    token: str
    ca_cert: Path | None
    deadline_s: float = 600.0

    def fetch(self, digest: str, size: int) -> bytes:
        """The blob named ``digest``, exactly ``size`` bytes."""
        return self._fetched(digest, size, lambda read: read(size))

    def fetch_records(self, digest: str, size: int) -> dict[str, Any]:
        """The array records of the blob named ``digest`` (``size`` bytes), read from the
        connection straight into them one array at a time (``records.decoded_stream``): no
        copy of the blob is held beside them. ``BlobError`` for a blob ``decoded`` refuses."""
        from fedweave.bulk.records import decoded_stream

        return self._fetched(digest, size, lambda read: decoded_stream(read, size))

    def _fetched(self, digest: str, size: int, consume: Callable[[Callable[[int], bytes]], T]) -> T:
        """What ``consume(read)`` makes of the blob named ``digest`` (``read(n)``: its next
        ``n`` bytes), once all ``size`` bytes were read within the deadline and hash to it."""
        end = time.monotonic() + self.deadline_s
        conn = None
        try:
            conn = self._connection()
            conn.request("GET", f"/v1/blobs/{digest}", headers=self._headers())
            response = conn.getresponse()
            self._check(response)
            if response.getheader("Content-Length") != str(size):
                raise TransferError(
                    f"the coordinator offered {response.getheader('Content-Length')} bytes "
                    f"for a model of {size}"
                )
            hashed, done = hashlib.sha256(), 0

            def read(count: int) -> bytes:
                nonlocal done
                if done + count > size:
                    raise TransferError("the model is longer than the size sent")
                parts = []
                while count > 0:
                    if time.monotonic() > end:
                        raise TransferError(f"fetching the model took over {self.deadline_s:g} s")
                    piece = response.read(min(count, CHUNK))
                    if not piece:
                        raise TransferError(f"the model's transfer ended {size - done} bytes short")
                    hashed.update(piece)
                    parts.append(piece)
                    done, count = done + len(piece), count - len(piece)
                return parts[0] if len(parts) == 1 else b"".join(parts)

            result = consume(read)
            if done != size or hashed.hexdigest() != digest:
                raise TransferError("the fetched model does not hash to the digest sent")
            return result
        except (OSError, http.client.HTTPException) as exc:
            raise TransferError(f"fetching the model failed: {_said(exc)}") from None
        finally:
            if conn is not None:
                conn.close()

    def upload(self, blob: bytes | list[bytes]) -> dict:
        """Upload ``blob`` (or a blob given as its pieces, ``records.encoded_parts``, sent
        piece by piece: no copy is made); returns the server's receipt (``upload``,
        ``digest``, ``size``)."""
        parts = [blob] if isinstance(blob, (bytes, bytearray, memoryview)) else list(blob)
        size = sum(len(part) for part in parts)
        conn = None
        try:
            conn = self._connection()
            conn.putrequest("PUT", "/v1/uploads", skip_accept_encoding=True)
            headers = {**self._headers(), "Content-Length": str(size),
                       "Expect": "100-continue"}  # fmt: skip
            for name, value in headers.items():
                conn.putheader(name, value)
            conn.endheaders()
            self._continue_or_refused(conn)
            end = time.monotonic() + self.deadline_s
            for part in parts:
                view = memoryview(part)
                for start in range(0, len(view), CHUNK):
                    if time.monotonic() > end:
                        raise TransferError(
                            f"uploading the update took over {self.deadline_s:g} s"
                        )
                    conn.send(view[start : start + CHUNK])
            response = conn.getresponse()
            self._check(response)
            receipt = json.loads(response.read(MAX_ANSWER_BYTES))
            if receipt.get("size") != size:  # TLS kept the bytes whole; the server hashed them
                raise TransferError("the coordinator received other bytes than were sent")
            return receipt
        except (OSError, ValueError, AttributeError, http.client.HTTPException) as exc:
            raise TransferError(f"uploading the update failed: {_said(exc)}") from None
        finally:
            if conn is not None:
                conn.close()

    @staticmethod
    def _continue_or_refused(conn: http.client.HTTPConnection) -> None:
        """Wait for the server's ``100 Continue`` (it checks the upload's token and size
        first), or raise its refusal."""
        reader = conn.sock.makefile("rb")
        status = reader.readline(MAX_ANSWER_BYTES)
        headers = {}
        while (line := reader.readline(MAX_ANSWER_BYTES)) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        parts = status.split(None, 2)
        if len(parts) >= 2 and parts[1] == b"100":
            return
        try:
            size = min(int(headers.get("content-length", "0")), MAX_ANSWER_BYTES)
            said = str(json.loads(reader.read(size)).get("error"))
        except (ValueError, AttributeError):
            said = status.decode("latin-1").strip() or "no answer"
        code = parts[1].decode("latin-1") if len(parts) >= 2 else "?"
        raise TransferError(f"the coordinator's transfer server answered {code}: {said}")

    def _connection(self) -> http.client.HTTPConnection:
        if self.ca_cert is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=IO_TIMEOUT_S)
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        return http.client.HTTPSConnection(
            self.host, self.port, timeout=IO_TIMEOUT_S, context=context
        )

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @staticmethod
    def _check(response: http.client.HTTPResponse) -> None:
        if response.status == 200:
            return
        try:
            said = str(json.loads(response.read(MAX_ANSWER_BYTES)).get("error"))
        except (ValueError, AttributeError, OSError):
            said = response.reason
        raise TransferError(f"the coordinator's transfer server answered {response.status}: "
                            f"{said}")  # fmt: skip


def _said(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
