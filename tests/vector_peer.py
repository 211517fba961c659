"""``python tests/vector_peer.py [--vector FILE.npy [--vector-examples N]] PEER-ARGS``: a real
gossip peer (``fedweave peer PEER-ARGS``) whose model is a fixed vector that is never trained
(``fedweave.gossip.learner.VectorLearner``), so a test or a protocol benchmark can check that
gossip alone averages it exactly. The product has no such switch: this script hands the peer
its learner, as ``vector_learner`` does for a peer built in a test's own process. Without
``--vector`` it is ``fedweave peer``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve()


def vector_learner(path: Path | str, num_examples: int = 1):
    """A ``build_learner`` stand-in: every peer it builds holds the vector saved at ``path``."""
    from fedweave.gossip.learner import VectorLearner

    vector = np.load(path, allow_pickle=False)
    return lambda config, peer_id: VectorLearner(vector, num_examples)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--vector", type=Path)
    parser.add_argument("--vector-examples", type=int, default=1)
    known, rest = parser.parse_known_args(argv)
    if rest and rest[0] == "peer":
        rest = rest[1:]
    if known.vector is not None:
        import fedweave.gossip.peer as peer_module

        peer_module.build_learner = vector_learner(known.vector, known.vector_examples)
        if not any(arg == "--threads" or arg.startswith("--threads=") for arg in rest):
            rest += ["--threads", "0"]  # nothing to train: no torch to import
    from fedweave.cli import main as fedweave_main

    fedweave_main(["peer", *rest])


if __name__ == "__main__":
    main(sys.argv[1:])
