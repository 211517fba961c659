"""Fingerprints of the Flower code each patch replaces or relies on, so a patch never lands on
code it was not written against.

The version guard (``PATCHED_FLOWER_VERSION``) catches a different release; a fingerprint
also catches an edited or vendored copy of the same version, and tells a Flower upgrade which
functions changed (``tests/test_flower_patches.py`` checks every entry). Each entry is the
SHA-256 (first 16 hex digits) of ``inspect.getsource`` of one Flower function or method,
taken from flwr 1.42.0 (a class: its whole body; a property: its getter). A security or
correctness patch (``admin_apis``, ``run_bundles``, ``tls_suites``, ``refused_keys``,
``secagg_masks``, ``secagg_crypto``, ``supernode_waits``, ``supernode_state``,
``node_restarts``, ``secagg_stages``) refuses to run on a mismatch, and so does a use of
Flower's unexported names that correctness relies on (``message_records``,
``default_workflow``, ``control_api``); a speed-up (the ClientApp worker included) falls back
to Flower's stock code with a warning.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
import tokenize
from pathlib import Path

_SECAGG_MOD = "flwr.client.mod.secure_aggregation.secaggplus_mod"
_SECAGG_WORKFLOW = "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
_SECAGG_ARITHMETIC = "flwr.common.secure_aggregation.ndarrays_arithmetic"
_LINKSTATE = "flwr.server.superlink.linkstate.in_memory_linkstate"
_DEFAULT_WORKFLOWS = "flwr.server.workflow.default_workflows"
_INFLATABLE_PROTO = "flwr.supercore.inflatable.inflatable_protobuf_utils"
_CONTROL_MW = "flwr.superlink.routers.control.middlewares"
_CORESTATE = "flwr.supercore.corestate.in_memory_corestate"

WRAPPED: dict[str, dict[str, str]] = {
    "admin_apis": {
        "flwr.superlink.main:_get_middleware": "911d5e2a5aaf11ec",  # 1.42: no tracing layer
        "flwr.superlink.main:create_app": "ee966b630c8ba8b5",
    },
    "run_bundles": {
        "flwr.superlink.servicer.control.control_handlers:start_run": "7f9355f11d8a76fc",
        "flwr.superlink.routers.control.router:start_run": "b2ba60f841634a30",
    },
    "refused_keys": {
        "flwr.superlink.servicer.fleet.fleet_handlers:activate_node": "0370edbbeb924eac",
        "flwr.superlink.routers.fleet.router:fleet_activate_node": "edb39539bc1a345a",
        # the key-registration wait: Flower passes a fastapi HTTPException on as its status,
        # and its SuperNode retries a 503 (the module holds the retried statuses)
        "flwr.supercore.error.http:http_error_translator": "63e39a121204a42b",
        "flwr.supercore.retry.http_retry:": "44a6170661312251",
    },
    "tls_suites": {
        "flwr.superlink.cli.flower_superlink:_run_superlink_http_api": "eb0d78b85f999576",
    },
    "superlink_middleware": {
        f"{_CONTROL_MW}:ControlSensitiveResponseMiddleware": "25cca938600324c2",
        f"{_CONTROL_MW}:_is_control_sensitive_route": "aae3ed426e1ef62c",
        f"{_CONTROL_MW}:ControlAuthenticationMiddleware": "1495e41d9bbbd25d",
        f"{_CONTROL_MW}:ControlLicenseMiddleware": "0f57194171e921a3",
        f"{_CONTROL_MW}:ControlEventLogMiddleware": "d8db2d506ca7d0c5",
        f"{_CONTROL_MW}:_is_control_path": "bfb5469e9013b256",
        "flwr.superlink.routers.fleet.middlewares:FleetEventLogMiddleware":
            "4466ecde96fb2315",
    },
    "deployed_polling": {
        "flwr.superlink.grid.http_grid:HttpGrid.send_and_receive": "699c9f048f3cff74",
        "flwr.supercore.inflatable.inflatable_utils:pull_objects": "31bb2de46b450e6a",
    },
    "supernode_waits": {
        "flwr.supernode.start_client_internal:start_client_internal": "9e89a6eb68fbec68",
        "flwr.supernode.start_client_internal:_push_messages": "00bb86faffdec114",
        "flwr.supercore.inflatable.inflatable_utils:pull_objects": "31bb2de46b450e6a",
    },
    "supernode_state": {
        "flwr.supernode.start_client_internal:start_client_internal": "9e89a6eb68fbec68",
        "flwr.supernode.start_client_internal:_init_connection": "800f9aba73646ea2",
        "flwr.supernode.fleet_http_connection:http_request_response": "b80ca36779c2657f",
        "flwr.supercore.retry.http_retry:make_simple_http_retry_invoker": "49e12326a4b17e26",
        "flwr.supercore.retry.retry_invoker:RetryInvoker.invoke": "14c8260448b85ac5",
        "flwr.supercore.retry.retry_invoker:RetryState": "84b599404d737e09",
        "flwr.supercore.error.base:ApiErrorCode": "d5e9ed6a18a359fc",
        "flwr.supercore.exit.exit_code:ExitCode": "b07980836e1d3225",  # named in messages
        # the coordinator's side: a refused key, a finished run's GetRun (403)
        "flwr.superlink.servicer.fleet.fleet_handlers:activate_node": "0370edbbeb924eac",
        "flwr.superlink.servicer.fleet.fleet_handlers:get_run": "004ad390c8b38c0e",
    },
    "task_expiry": {
        # the worker's beats read the interval as a module global, and so do the SuperNode's
        # task claims, activations, beats and expiries
        "flwr.supercore.heartbeat:HeartbeatSender._run": "b176ff96c68dbee2",
        f"{_CORESTATE}:InMemoryCoreState.claim_task": "a81e71e96256b2dd",
        f"{_CORESTATE}:InMemoryCoreState.activate_task": "5cf2d5e25cb8e101",
        f"{_CORESTATE}:InMemoryCoreState.acknowledge_task_heartbeat": "e00234bd219b7afa",
        f"{_CORESTATE}:InMemoryCoreState._cleanup_expired_task_tokens_locked":
            "4d292bc46bb868be",
        "flwr.supernode.nodestate.in_memory_nodestate:InMemoryNodeState._on_task_tokens_expired":
            "a181b661f768cc12",
    },
    "node_restarts": {
        f"{_LINKSTATE}:InMemoryLinkState.activate_node": "ddd272f4a52bcc3e",
    },
    "simulation_engine": {
        "flwr.server.superlink.fleet.vce.vce_api:add_messages_to_queue": "953f4bd41a931a77",
        "flwr.server.superlink.fleet.vce.backend.raybackend:RayBackend.build": "6a0c387457a6dbc1",
        "flwr.superlink.grid:InMemoryGrid.__init__": "028fa3ed6b4181bb",
    },
    "secagg_masks": {
        f"{_SECAGG_MOD}:quantize": "5371722c0320e506",
        f"{_SECAGG_MOD}:pseudo_rand_gen": "19ee2545ed58c017",
        f"{_SECAGG_WORKFLOW}:pseudo_rand_gen": "19ee2545ed58c017",
        # secagg_vectors: where the site's reply carries its masked vector (the coordinator's
        # collect stage, which reads it there, is secagg_stages')
        f"{_SECAGG_MOD}:_collect_masked_vectors": "d638fe6563407bc1",
        f"{_SECAGG_MOD}:secaggplus_mod": "cc0e7d467b4de166",
        # the steps of _collect_masked_vectors done in place (the same values): its update
        # read where its bytes lie, scaled as it is quantized, each mask added a part at a time
        "flwr.compat.common.parameter:parameters_to_ndarrays": "69a0e67ab5746d02",
        "flwr.compat.common.parameter:bytes_to_ndarray": "6038dd1205aa7c37",
        f"{_SECAGG_ARITHMETIC}:parameters_multiply": "6481cbf27c3be9ec",
        f"{_SECAGG_ARITHMETIC}:parameters_addition": "ea390ddeeb2a1ed5",
        f"{_SECAGG_ARITHMETIC}:parameters_subtraction": "4bbda8831c47c180",
        f"{_SECAGG_ARITHMETIC}:parameters_mod": "5c280c923a2336c9",
    },
    "secagg_crypto": {
        f"{_SECAGG_MOD}:create_shares": "d922b6370cd57ff1",
        f"{_SECAGG_MOD}:generate_key_pairs": "e551269ddc680868",
        f"{_SECAGG_MOD}:bytes_to_private_key": "ed52cf7696efe92c",
        f"{_SECAGG_WORKFLOW}:combine_shares": "e9339f2cd706eed4",
    },
    "clientapp_worker": {
        "flwr.supernode.runtime.run_clientapp:pull_task_input": "5607a23e1673ee87",
        "flwr.supernode.runtime.run_clientapp:push_message": "07cb512c93e065a9",
        "flwr.supernode.runtime.run_clientapp:push_task_output": "9206407456e79e17",
        "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree":
            "139811483a15e4a6",
        "flwr.supercore.task_identity:TaskIdentity": "49ac1df12b140345",
        "flwr.supercore.task_identity:_TaskIdentityMeta": "464d7e46fc5a29ed",
        "flwr.app.metadata:Metadata.message_id": "9e0e1b5a50c5ff09",
        # what pull_task_input decodes with, and what flwr-clientapp / flower-superexec do
        # around it (runtime_client, acquire_task, task_heartbeat, the codes a task ends with)
        "flwr.common.serde:context_from_proto": "fcb12600c42b3f08",
        "flwr.common.serde:fab_from_proto": "4aabaac291511dc4",
        "flwr.common.serde:run_from_proto": "df1eec4d142c2658",
        f"{_INFLATABLE_PROTO}:make_pull_object_fn_protobuf": "ede05e6314fa253a",
        f"{_INFLATABLE_PROTO}:make_confirm_message_received_fn_protobuf": "5bf6af3230b999e2",
        "flwr.proto.node_pb2:": "1ae2c36660f87bd2",  # generated: the whole module
        "flwr.proto.runtime_pb2:": "26de3ed4d231b6da",  # generated: the whole module
        "flwr.supercore.runtime.runtime_http_client:RuntimeHttpClient": "9d66e89a62052127",
        "flwr.supercore.interceptors.http.runtime_token:RuntimeTokenHttpInterceptor":
            "06cbf14d2ea81c27",
        "flwr.supercore.interceptors.http.runtime_version:RuntimeVersionHttpInterceptor":
            "32dc4f3d763a9ca0",
        "flwr.supercore.retry.http_retry:make_simple_http_retry_invoker": "49e12326a4b17e26",
        "flwr.supercore.heartbeat:HeartbeatSender": "27714c8e35121c84",
        "flwr.supercore.heartbeat:make_task_heartbeat_fn_http": "a50247986fc79b04",
        "flwr.supercore.constant:TaskType": "83fa24c88e9291ed",
        "flwr.clientapp.client_app:LoadClientAppError": "c2dce8f5e6fb7b75",
        "flwr.common.constant:ErrorCode": "4889fc3e5b669ac5",
        "flwr.common.constant:SubStatus": "3250f760cd3385b2",
    },
    "message_records": {  # not a patch: names Flower does not export, used as they are
        "flwr.compat.common.recorddict_compat:": "1d9639fe2d20777b",  # the whole module
        "flwr.clientapp.typing:": "e3558841af35af9a",  # the whole module: type aliases
        # modules of constants: a constant has no source of its own
        "flwr.common.secure_aggregation.secaggplus_constants:": "e5de5f960b54d566",
        "flwr.supercore.differential_privacy:": "50c1626b7be3ce77",
        "flwr.common.constant:ErrorCode": "4889fc3e5b669ac5",
    },
    "control_api": {  # not a patch: the coordinator's Control API calls and its bundle
        "flwr.supercore.control.control_http_client:ControlHttpClient": "ee524b3741ae8cf8",
        "flwr.proto.control_pb2:": "c59e5d8926978936",  # generated: the whole module
        "flwr.common.serde:fab_to_proto": "c5b60150389ce73f",
        "flwr.supercore.fab:Fab": "140aff940cdb015e",
        "flwr.supercore.primitives.asymmetric:public_key_to_bytes": "552b787ae3438eaf",
        "flwr.cli.build:build_fab_from_files": "4c576876bcbbcf6a",
    },
    "secagg_stages": {
        f"{_SECAGG_WORKFLOW}:WorkflowState": "91415782137e66cd",
        f"{_SECAGG_WORKFLOW}:SecAggPlusWorkflow.__init__": "1b479709e3ccb88f",
        f"{_SECAGG_WORKFLOW}:SecAggPlusWorkflow.__call__": "204402b446244e5e",
        f"{_SECAGG_WORKFLOW}:SecAggPlusWorkflow.setup_stage": "892a5a68cc6aef04",
        f"{_SECAGG_WORKFLOW}:SecAggPlusWorkflow.share_keys_stage": "a22dfd6309540039",
        f"{_SECAGG_WORKFLOW}:SecAggPlusWorkflow.collect_masked_vectors_stage":
            "e2e2900e524ba35a",
        f"{_SECAGG_WORKFLOW}:SecAggPlusWorkflow.unmask_stage": "c4639d18768446e9",
        # secagg_sum: the two stages above done in place, with the arithmetic they call
        f"{_SECAGG_WORKFLOW}:SecAggPlusWorkflow._check_threshold": "5cbbc3639376397c",
        f"{_SECAGG_WORKFLOW}:factor_extract": "15a5f6bc8eed9f06",
        "flwr.common.secure_aggregation.quantization:dequantize": "a8188d6750325f56",
        f"{_SECAGG_ARITHMETIC}:parameters_mod": "5c280c923a2336c9",
        f"{_SECAGG_ARITHMETIC}:parameters_addition": "ea390ddeeb2a1ed5",
        f"{_SECAGG_ARITHMETIC}:parameters_subtraction": "4bbda8831c47c180",
    },
    "default_workflow": {  # not a patch: names Flower does not export, used as they are
        "flwr.server.workflow.constant:": "e2dd8c4ef3895250",  # the whole module
        f"{_DEFAULT_WORKFLOWS}:DefaultWorkflow.__call__": "866c7974d30c0149",
        f"{_DEFAULT_WORKFLOWS}:default_fit_workflow": "180d595f43251849",
        f"{_DEFAULT_WORKFLOWS}:default_evaluate_workflow": "54dfd81e37bc9220",
        "flwr.server.client_proxy:ClientProxy": "5c7a77877c3710ef",
        "flwr.server.compat.grid_client_proxy:GridClientProxy": "1aabe36b4f97fa39",
    },
}
"""Patch name → {``module:function`` it relies on → fingerprint of that function's source}.

Besides the patches, entries fingerprint the Flower code fedweave relies on without replacing
it, each for the module of this folder that alone imports it (``tests/test_layout.py`` keeps
every other module to Flower's exported API):

- ``clientapp_worker`` (a speed-up: a site runs its worker only where these match): the site's
  worker runs Flower's per-message functions and sets what they set, and calls the Runtime
  API as ``flower-superexec`` and ``flwr-clientapp`` do;
- ``secagg_stages``: fedweave runs SecAgg+'s workflow stage by stage and edits its state,
  and runs its collect and unmask stages with their arithmetic in place (``secagg_sum``);
- ``message_records``: Flower's legacy message layout (``recorddict_compat``), its mods'
  record keys, its mod types and error codes, read and written by the site's mods and the
  coordinator's rounds;
- ``default_workflow``: ``coordinator/rounds/deadlines.py`` hands Flower's default fit workflow
  a grid that bounds its wait, and the coordinator's own fit and evaluate workflows
  (``federated_statistics.py``, ``federated_evaluation.py``, ``private_evaluation.py``,
  ``secure_buffer.py``) read and write the records ``DefaultWorkflow`` keeps in the context
  (``flwr.server.workflow.constant``: the round number, the global parameters) as Flower's
  default workflows do, with its ``ClientProxy`` and ``GridClientProxy``;
- ``control_api``: the coordinator's Control API client, requests and bundle builder.

The last four refuse on a mismatch (``secagg_stages`` as its workflow is built, the others as
their module is imported: ``rely_on``). Generated protobuf modules (``*_pb2``) and modules of
constants are fingerprinted whole (``module:``): a message class or a constant has no source of
its own, and the generated source carries every field's name and number."""


def fingerprint(ref: str) -> str:
    """The fingerprint of ``module:function`` (``module:`` for a whole module) as installed
    (its source's SHA-256, 16 digits)."""
    module_name, _, name = ref.partition(":")
    target = importlib.import_module(module_name)
    for part in name.split(".") if name else []:  # a method: Class.method; none: the module
        target = getattr(target, part)
    if isinstance(target, property):
        target = target.fget
    target = getattr(target, "__wrapped__", target)
    return hashlib.sha256(inspect.getsource(target).encode()).hexdigest()[:16]


def _source_file(module_name: str) -> Path | None:
    """The installed source file of ``module_name``, found without importing it or its
    parent packages (None where it is not a plain ``.py`` file in its top package's folder)."""
    top, _, rest = module_name.partition(".")
    spec = importlib.util.find_spec(top)  # a top-level name: located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    path = folder.joinpath(*rest.split(".")) if rest else folder
    candidates = [path.with_name(path.name + ".py")] if rest else []
    return next((c for c in [*candidates, path / "__init__.py"] if c.is_file()), None)


@functools.cache
def _parsed(path: Path) -> tuple[str, ast.Module]:
    with tokenize.open(path) as source:  # read as inspect reads it (linecache)
        text = source.read()
    return text, ast.parse(text)


def static_fingerprint(ref: str) -> str | None:
    """``fingerprint(ref)`` read from the installed file without importing Flower (~1.5 s
    of CPU a process), or None where the file alone cannot say: the module is imported
    already (what runs, which may have been changed in memory, is what counts), or the
    name is re-exported, defined twice or inside an ``if``. Then only ``fingerprint`` says."""
    module_name, _, name = ref.partition(":")
    if module_name in sys.modules:
        return None
    try:
        path = _source_file(module_name)
        if path is None:
            return None
        text, node = _parsed(path)
    except (OSError, SyntaxError, ValueError, ImportError):
        return None
    if name:
        for part in name.split("."):
            found = [
                child
                for child in ast.iter_child_nodes(node)
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and child.name == part
            ]
            if len(found) != 1:
                return None
            node = found[0]
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        text = "".join(text.splitlines(keepends=True)[first - 1 : node.end_lineno])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def mismatches(patch: str) -> list[str]:
    """The functions ``patch`` wraps whose installed source differs from what it was written
    against (empty: safe to apply). Read from the files first: Flower is imported only for a
    reference whose file alone does not match."""
    found = []
    for ref, expected in WRAPPED[patch].items():
        if static_fingerprint(ref) == expected:
            continue
        try:
            actual = fingerprint(ref)
        except (ImportError, AttributeError, OSError, TypeError):
            actual = "missing"
        if actual != expected:
            found.append(ref)
    return found
