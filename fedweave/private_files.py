"""Files fedweave creates that hold model weights, history or logs are readable by their
owner only (mode 0600), whatever the process's umask: on a shared machine a checkpoint, an
exported model, a history database or a site's log is its consortium's, not every local
user's.

Only a file that does not exist yet is created 0600; one that exists keeps the mode its owner
gave it (that is how to ask for otherwise: ``chmod`` it once, and fedweave's later writes
leave the mode alone). Keys and certificates have their own writers (``fedweave/certs.py``,
``gossip/keys.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

PRIVATE_MODE = 0o600

_FLAGS = {
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


def open_private(path: str | Path, mode: str = "w", **kwargs: Any) -> IO[Any]:
    """``open(path, mode, **kwargs)`` for writing (``mode``: ``w``, ``a``, ``wb`` or ``ab``),
    a new file created 0600."""
    fd = os.open(path, _FLAGS[mode[0]], PRIVATE_MODE)
    return os.fdopen(fd, mode, **kwargs)


def create_private(path: str | Path) -> None:
    """Create ``path`` empty and 0600 unless it exists, for a library to write into (SQLite,
    safetensors, ``shutil.copyfile``: each keeps the mode of a file that exists)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_MODE))


def write_private_text(path: str | Path, text: str) -> None:
    """``Path(path).write_text(text)``, a new file created 0600."""
    with open_private(path, "w", encoding="utf-8") as handle:
        handle.write(text)
