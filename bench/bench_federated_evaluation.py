"""What federated evaluation costs a deployed round: 3 sites on ``digits``, loopback, TLS,
registered site keys, plain and with SecAgg+, the coordinator holding the test set (so
central evaluation runs in both), with federated evaluation every round (``--evaluate-every
1``, every site, on its 10% held-out part) and without it (``--evaluate-every 0``).

Federated evaluation is one more message round trip per round (an ``evaluate`` message to
each site and its reply). The figure to compare it with is a plain round's own time, which is
one message round trip plus the sites' training. Each figure is the median of rounds 2..R.
Under SecAgg+ it also times ``--private-evaluation`` (the figures through one more SecAgg+
exchange: four round trips instead of one).

    python bench/bench_federated_evaluation.py [--rounds 6] [--sites 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_deployment import fedweave_run, prepare  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per run (default 6)")
    parser.add_argument("--sites", type=int, default=3, help="sites (default 3)")
    args = parser.parse_args()
    if args.rounds < 2 or args.sites < 3:
        parser.error("--rounds >= 2; --sites >= 3")
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    medians: dict[tuple[bool, bool | str], float] = {}
    with tempfile.TemporaryDirectory(prefix="fedweave-bench-fedeval-") as tmp:
        work = Path(tmp)
        prepare(work, args.sites, env)
        for secure in (False, True):
            for evaluate in (False, True):
                flags = ("--evaluate-every", "1" if evaluate else "0")
                seconds = fedweave_run(work, args.sites, args.rounds, secure, env, flags)
                medians[(secure, evaluate)] = statistics.median(seconds[1:])
                print(
                    f"  {'SecAgg+' if secure else 'plain'}, federated evaluation "
                    f"{'on' if evaluate else 'off'}: " + " ".join(f"{s:.2f}" for s in seconds),
                    file=sys.stderr,
                )
        flags = ("--evaluate-every", "1", "--private-evaluation")
        seconds = fedweave_run(work, args.sites, args.rounds, True, env, flags)
        medians[(True, "private")] = statistics.median(seconds[1:])
        print(
            "  SecAgg+, private evaluation: " + " ".join(f"{s:.2f}" for s in seconds),
            file=sys.stderr,
        )
    print(
        f"deployed rounds, {args.sites} sites, digits, loopback, TLS + site keys; "
        f"median s of rounds 2..{args.rounds}"
    )
    print(f"{'mode':<9}{'eval off':>10}{'eval on':>10}{'added':>9}{'on/off':>8}")
    for secure in (False, True):
        off, on = medians[(secure, False)], medians[(secure, True)]
        print(
            f"{'SecAgg+' if secure else 'plain':<9}{off:>10.3f}{on:>10.3f}{on - off:>9.3f}"
            f"{on / off:>8.2f}"
        )
    off, private = medians[(True, False)], medians[(True, "private")]
    print(
        f"{'private':<9}{off:>10.3f}{private:>10.3f}{private - off:>9.3f}{private / off:>8.2f}"
        "   (SecAgg+ with --private-evaluation)"
    )
    plain_round = medians[(False, False)]
    added = medians[(False, True)] - plain_round
    print(
        f"federated evaluation adds {added:.3f} s to a plain round; a whole plain round (one "
        f"message round trip plus training) takes {plain_round:.3f} s: ratio "
        f"{added / plain_round:.2f}"
    )


if __name__ == "__main__":
    main()
