"""One console line per site key the SuperLink refused (``fedweave.flower_patches
.refused_keys`` writes them), naming a revoked key's site and the fix for an unknown one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

MAX_SHOWN = 20
"""Distinct refused keys printed; anyone can make keys, so the console is bounded too."""


class RefusedKeys:
    """Follows the SuperLink's refused-key notes; prints each key once per verdict (a key
    refused before it was registered is shown again once it is revoked).

    Args:
        path: the notes file (``FEDWEAVE_REFUSED_KEYS_FILE`` of the SuperLink).
        tls_dir: the coordinator's ``--tls-dir`` (its ``revoked/`` keys get their names back).
        echo: where the lines go (the operator's terminal).
    """

    def __init__(self, path: Path, tls_dir: Path | None, echo: Callable[[str], None]) -> None:
        self.path, self.tls_dir, self.echo = path, tls_dir, echo
        self.offset = 0
        self.shown: set[tuple[str, str | None]] = set()

    def _revoked_names(self) -> dict[str, str]:
        from fedweave.certs import site_keys_table

        if self.tls_dir is None:
            return {}
        return {fp: name for name, state, fp in site_keys_table(self.tls_dir) if state == "revoked"}

    def poll(self) -> None:
        try:
            with self.path.open("r", encoding="utf-8") as notes:
                notes.seek(self.offset)
                lines = notes.readlines()
                self.offset = notes.tell()
        except OSError:
            return
        for line in lines:
            try:
                fingerprint = str(json.loads(line)["fingerprint"])
            except (ValueError, KeyError, TypeError):
                continue
            name = self._revoked_names().get(fingerprint)
            if (fingerprint, name) in self.shown or len(self.shown) > MAX_SHOWN:
                continue
            self.shown.add((fingerprint, name))
            if len(self.shown) > MAX_SHOWN:
                self.echo(f"more site keys refused; not shown (see {self.path})")
                continue
            if name is not None:
                self.echo(f"refused site key {fingerprint}: {name}'s key, revoked")
            else:
                self.echo(
                    f"refused site key {fingerprint}: not registered; if it is a site of "
                    "yours, add its .pub with `fedweave sites add-key DIR site.pub`"
                )
