"""Flower's legacy message layout, its mods' record keys and its error codes, for the site's
mods and the coordinator's rounds (not a patch: unexported Flower names, used as they are).

A site and its coordinator speak Flower's legacy strategy API (``NumPyClient``, ``FedAvg``,
SecAgg+ needs it) over Flower's Message API. Flower 1.41 converts between the two with
``flwr.compat.common.recorddict_compat``, which it does not export; fedweave's own mods and
strategies (held updates, compression, federated and private evaluation, FedBuff, the reply
check of ``coordinator/rounds/site_outcomes.py``) convert the same way, and read the record
names it writes (``fitins.config``, ``evaluateres.loss``, ...). They also read the keys by
which the coordinator asks Flower's mods for SecAgg+ (``RECORD_KEY_CONFIGS``) and for
clipping (``KEY_CLIPPING_NORM``), type their mods with Flower's ``Mod`` and
``ClientAppCallable``, and tell Flower's error codes from a site's own (``ErrorCode``).

All of these are fingerprinted (``fingerprints``, entry ``message_records``: the conversion
module, the typing module and the two key modules whole, ``ErrorCode``'s class), and this
module refuses to be imported on Flower code that differs (``rely_on``): a misread record
would corrupt a round silently.
"""

from __future__ import annotations

from fedweave.flower_patches import rely_on

rely_on("message_records")

from flwr.clientapp.typing import ClientAppCallable, Mod  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS  # noqa: E402
from flwr.compat.common.recorddict_compat import (  # noqa: E402
    arrayrecord_to_parameters,
    evaluateins_to_recorddict,
    fitins_to_recorddict,
    fitres_to_recorddict,
    recorddict_to_evaluateres,
    recorddict_to_fitins,
    recorddict_to_fitres,
)
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM  # noqa: E402

__all__ = [
    "KEY_CLIPPING_NORM",
    "RECORD_KEY_CONFIGS",
    "ClientAppCallable",
    "ErrorCode",
    "Mod",
    "arrayrecord_to_parameters",
    "evaluateins_to_recorddict",
    "fitins_to_recorddict",
    "fitres_to_recorddict",
    "recorddict_to_evaluateres",
    "recorddict_to_fitins",
    "recorddict_to_fitres",
]
