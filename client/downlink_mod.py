"""The site mod that restores a model the coordinator sent at half precision
(``--downlink fp16``).

It sits just inside the mod that turns outcomes into replies, before everything else: every
later mod (the update check, compression, SecAgg+'s masking, DP) and the site's task see the
model in the dtypes its tensors had at the coordinator, rounded once. The mark of what was
halved (``DOWNLINK_KEY``) is the coordinator's word; one that does not fit the model it came
with is this site's refusal, named, and nothing is trained.
"""

from __future__ import annotations

from flwr.app import Context, Message

from fedweave.contract import DOWNLINK_KEY, SiteRefusal
from fedweave.downlink import legacy_record, mark_problem, model_records, restored
from fedweave.flower_patches.message_records import ClientAppCallable


def downlink_restored(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """``msg`` with each model sent at half precision restored to its dtypes; the rest passes
    through."""
    content = msg.content
    for arrays_name, config_name in list(model_records(content)):
        config = content.config_records[config_name]
        if DOWNLINK_KEY not in config:
            continue
        record = content.array_records[arrays_name]
        arrays = [array.numpy() for array in record.values()]
        mark = config[DOWNLINK_KEY]
        problem = mark_problem(mark, [array.dtype for array in arrays])
        if problem is not None:
            raise SiteRefusal(
                f"the model arrived at half precision but {problem}; the coordinator and this "
                "site disagree on the message layout: run the same fedweave version on both"
            )
        content.array_records[arrays_name] = legacy_record(restored(arrays, str(mark)), record)
        del config[DOWNLINK_KEY]  # restored: a second pass leaves it alone
    return call_next(msg, context)
