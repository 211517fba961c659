"""``python -m fedweave.coordinator.superlink_process ARGS``: Flower's ``flower-superlink`` with
fedweave's SuperLink patch applied first (``fedweave.flower_patches.let_sites_rejoin_at_once``:
a restarted site takes its node back at once). Takes exactly ``flower-superlink``'s arguments;
``fedweave coordinator`` starts it, so an operator never runs it by hand.
"""

from __future__ import annotations

import sys


def main() -> None:
    from flwr.superlink.cli import flower_superlink

    from fedweave.flower_patches import let_sites_rejoin_at_once

    let_sites_rejoin_at_once()
    sys.argv[0] = "flower-superlink"
    flower_superlink()


if __name__ == "__main__":
    main()
