"""The Flower side of a site's long-lived ClientApp worker (``fedweave.client.worker``).

Flower 1.41 has no public API for running a ClientApp task outside ``flwr-clientapp``; the
worker does what that process does for one message with the functions of
``flwr.supernode.runtime.run_clientapp``, all of them here:

- ``pull_task_input``: Flower's own for 1.41, copied because it has no backoff parameter,
  with the shorter first object-pull backoff of ``object_pulls`` (the worker asks for its
  message within 0.1 s of the SuperNode creating the task, usually before the SuperNode has
  the message's weights, and Flower's 1 s first backoff then cost a second or three per
  message). As Flower's does, it sets the process's ``TaskIdentity`` class attributes and
  writes the pulled message's id into ``Metadata.__dict__["_message_id"]`` (the deflated
  message carries no id of its own);
- ``push_reply`` and ``push_outcome``: Flower's ``push_message`` and ``push_task_output``;
- what ``flower-superexec`` and ``flwr-clientapp`` do around them, with Flower's unexported
  Runtime API client, interceptors, retry invoker, heartbeat and task messages:
  ``runtime_client``, ``acquire_task``, ``task_heartbeat``, ``error_reply``, and the codes
  and statuses a task ends with (``ErrorCode``, ``SubStatus``, ``LoadClientAppError``).

Every Flower function or class these rely on is fingerprinted (``fingerprints``, entry
``clientapp_worker``; ``runtime_pb2`` whole, the wire's generated source);
``clientapp_worker_usable`` lets a site run the worker only where all of them match flwr
1.41.0 (elsewhere the site's SuperNode starts Flower's own ``flwr-clientapp``).
"""

from __future__ import annotations

from typing import Any

from flwr.clientapp.client_app import LoadClientAppError
from flwr.common.constant import ErrorCode, SubStatus

__all__ = [
    "ErrorCode",
    "LoadClientAppError",
    "SubStatus",
    "acquire_task",
    "error_reply",
    "pull_task_input",
    "push_outcome",
    "push_reply",
    "runtime_client",
    "task_heartbeat",
]


def runtime_client(address: str, token: str | None) -> Any:
    """A client of the SuperNode's Runtime API at ``address``: with ``token`` for one task's
    calls (as ``flwr-clientapp``), else for ``AcquireTask`` (as ``flower-superexec``)."""
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    component = "flwr-clientapp" if token else "SuperExec"
    interceptors = [RuntimeVersionHttpInterceptor(component_name=component)]
    if token:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,  # the Runtime API listens on loopback only, as under flower-superexec
        root_certificates=None,
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )


def acquire_task(client: Any) -> str | None:
    """A token for the next pending ClientApp task, or None."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType

    response = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
    return response.token if response.HasField("task") and response.token else None


def task_heartbeat(client: Any) -> Any:
    """Flower's ``HeartbeatSender`` for the task ``client``'s token names (not started),
    beating every 3.5 to 4.5 s (``task_expiry``)."""
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http

    from fedweave.flower_patches.task_expiry import beat_often

    beat_often()
    return HeartbeatSender(make_task_heartbeat_fn_http(client))


def error_reply(message: Any, code: int, reason: str) -> Any:
    """The error reply to ``message`` that ``flwr-clientapp`` sends when its ClientApp fails."""
    from flwr.app import Error, Message

    return Message(Error(code=code, reason=reason), reply_to=message)


def pull_task_input(client):
    """Flower's ``run_clientapp.pull_task_input`` for 1.41, with the shorter first backoff:
    the message, context, run and FAB of the task ``client``'s token names."""
    from flwr.app import Message
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
    from flwr.supercore.task_identity import TaskIdentity

    from fedweave.flower_patches.object_pulls import quick

    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context, run, fab = (
        context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)
    )
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = quick(pull_and_inflate_object_from_tree)(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(
            client.ConfirmMessageReceived, node, context.run_id
        ),
        return_type=Message,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower's own pull sets it
    return message, context, run, fab


def push_reply(client, reply, context) -> None:
    """Flower's ``run_clientapp.push_message``: the ClientApp's reply to the SuperNode."""
    from flwr.supernode.runtime.run_clientapp import push_message

    push_message(client, reply, context)


def push_outcome(client, context, sub_status: str, details: str) -> None:
    """Flower's ``run_clientapp.push_task_output``: how the task ended (and its context)."""
    from flwr.supernode.runtime.run_clientapp import push_task_output

    push_task_output(client, context, sub_status, details)
