"""The floor under a round's transfers (issue 36): the seconds the bytes of one round take over
loopback TLS through fedweave's transfer server alone, with nothing else in the round.

    python bench/bench_bulk_floor.py [--model TASK|WIDE|HUGE] [--sites 3] [--repeat 3]

One blob the size of the model is fetched by every site at once (threads, each its own HTTPS
connection verifying the coordinator's certificate), then every site uploads one of the same
size at once; both with the checks a round makes (the digest at the site, the token and size at
the server, the spool on disk). It prints the median seconds of each half and of both, and the
rate. ``bench_large_model.py --transfer bulk`` measures the same bytes inside deployed rounds;
the difference is the rest of the round (Flower's messages, training's neighbours,
aggregation, the checkpoint).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

PARAMETERS = {"TASK": 17_114_122, "WIDE": 67_716_106, "HUGE": 257_216_010}


def main() -> None:
    from flwr.app import Array, ArrayRecord

    from fedweave.bulk.records import encoded
    from fedweave.bulk.server import BulkServer
    from fedweave.bulk.spool import Spool
    from fedweave.bulk.transfer import Link
    from fedweave.certs import init_certificates

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=tuple(PARAMETERS), default="TASK")
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    weights = np.random.default_rng(0).standard_normal(PARAMETERS[args.model], np.float32)
    blob = encoded({"fitins.parameters": ArrayRecord(array_dict={"0": Array(weights)})})
    del weights
    with tempfile.TemporaryDirectory(prefix="fedweave-bulk-floor-") as tmp:
        tls = init_certificates(Path(tmp) / "tls", ["localhost"])
        spool = Spool(Path(tmp) / "spool")
        server = BulkServer(("127.0.0.1", 0), spool, (tls.server_cert, tls.server_key)).start()
        digest = spool.put_blob(blob)
        fetches, uploads = [], []
        try:
            with ThreadPoolExecutor(args.sites) as pool:
                for _ in range(args.repeat):
                    links = [Link("127.0.0.1", server.port,
                                  spool.grant(node, [digest], 2 * len(blob), 600), tls.ca_cert)
                             for node in range(args.sites)]  # fmt: skip
                    started = time.perf_counter()
                    list(pool.map(lambda link: link.fetch(digest, len(blob)), links))
                    fetches.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    receipts = list(pool.map(lambda link: link.upload(blob), links))
                    uploads.append(time.perf_counter() - started)
                    for node, receipt in enumerate(receipts):
                        spool.take_upload(receipt["upload"], node)
        finally:
            server.close()
    moved = 2 * args.sites * len(blob)
    fetch, upload = statistics.median(fetches), statistics.median(uploads)
    print(f"{args.model} ({len(blob) / 1e6:.0f} MB), {args.sites} sites at once over loopback "
          f"TLS, median of {args.repeat}: fetch {fetch:.2f} s, upload {upload:.2f} s, a round's "
          f"{moved / 1e6:.0f} MB in {fetch + upload:.2f} s ({moved / 1e6 / (fetch + upload):.0f} "
          "MB/s)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
