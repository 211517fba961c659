"""``python -m fedweave.client.supernode ARGS``: Flower's ``flower-supernode`` with fedweave's
SuperNode patches applied first (``fedweave.flower_patches.bound_supernode_waits``: capped
sleeps, a reply wait that ends). Takes exactly ``flower-supernode``'s arguments; ``fedweave
client`` starts it, so a site operator never runs it by hand.
"""

from __future__ import annotations

import sys


def main() -> None:
    from flwr.supernode.cli.flower_supernode import flower_supernode

    from fedweave.flower_patches import bound_supernode_waits

    bound_supernode_waits()
    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
