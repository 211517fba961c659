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
- ``push_reply`` and ``push_outcome``: Flower's ``push_message`` and ``push_task_output``.

Every Flower function or class these rely on is fingerprinted (``fingerprints``, entry
``clientapp_worker``); ``clientapp_worker_usable`` lets a site run the worker only where all
of them match flwr 1.41.0.
"""

from __future__ import annotations


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
