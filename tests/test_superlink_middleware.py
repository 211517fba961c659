"""The SuperLink's middleware layers run only for the requests they act on
(``fedweave.flower_patches.superlink_middleware``), on Flower's own app: the same answers as
stock, with the Control-only and plugin-only layers out of a site's path."""

import json
import subprocess
import sys

PROBE = """
import json, sys
from collections import Counter
from starlette.testclient import TestClient
from fedweave.flower_patches import close_control_surface, tune_superlink_middleware
from fedweave.flower_patches.superlink_middleware import INERT, _resolve
close_control_surface()
if sys.argv[1] == "patched":
    assert tune_superlink_middleware()
calls = Counter()
for ref in INERT:
    cls = _resolve(ref)
    async def dispatch(self, request, call_next, _stock=cls.dispatch, _name=cls.__name__):
        calls[_name + " " + request.url.path] += 1
        return await _stock(self, request, call_next)
    cls.dispatch = dispatch
from flwr.superlink.main import create_app
answers = {}
with TestClient(create_app(), client=("127.0.0.1", 5555)) as client:
    for path in sys.argv[2:]:
        r = client.post(path, content=b"", headers={"content-type": "application/protobuf"})
        answers[path] = [r.status_code, r.headers.get("content-type"),
                         r.headers.get("cache-control"), r.content.hex()]
print(json.dumps({"answers": answers, "dispatched": sorted(calls)}))
"""

PATHS = [
    "/v1/fleet/pull-messages",  # a site's request, unsigned: refused by site authentication
    "/v1/fleet/push-messages",
    "/v1/control/get-login-details",  # a sensitive Control route: answered no-store
    "/v1/control/list-nodes",
    "/v1/runtime/get-nodes",  # the ServerApp's API, without its token
    "/health",
]


def _probe(variant: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, variant, *PATHS],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_sites_request_skips_the_layers_that_would_pass_it_through_with_the_same_answers():
    stock, patched = _probe("stock"), _probe("patched")
    list_nodes = "/v1/control/list-nodes"  # its body carries the time it was answered
    assert stock["answers"][list_nodes][:3] == patched["answers"][list_nodes][:3]
    stock["answers"].pop(list_nodes), patched["answers"].pop(list_nodes)
    assert patched["answers"] == stock["answers"]
    assert stock["answers"]["/v1/fleet/pull-messages"][0] == 401
    assert stock["answers"]["/v1/control/get-login-details"][2] == "no-store"
    # stock: every Control-only layer ran for every request, a site's included
    assert "ControlAuthenticationMiddleware /v1/fleet/pull-messages" in stock["dispatched"]
    assert "ControlLicenseMiddleware /v1/fleet/push-messages" in stock["dispatched"]
    # patched: each layer ran only where it acts (no event-log plugin here)
    control = ["ControlAuthenticationMiddleware", "ControlEventLogMiddleware",
               "ControlLicenseMiddleware"]  # fmt: skip
    assert patched["dispatched"] == sorted(
        [f"{layer} {path}" for layer in control
         for path in ("/v1/control/get-login-details", list_nodes)]
        + ["ControlSensitiveResponseMiddleware /v1/control/get-login-details"]
    )  # fmt: skip
