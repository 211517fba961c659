"""``python -m fedweave.gossip ...``: ``fedweave peer ...`` (``keys ...`` too) without the console
script; simulations and tests launch peers this way."""

from __future__ import annotations

import sys

from fedweave.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    main(args if args and args[0] in ("peer", "keys") else ["peer", *args])
