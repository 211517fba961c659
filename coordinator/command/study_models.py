"""A study's initial model named by a history run (``initial_model = "run:RUN_ID"``), given
only where the submitting operator may read that run: one it submitted, or any with the role
``read-all``. Any other run, and a run that does not exist, gets the same one line, so a
study cannot learn which runs there are.

The run's final model is exported once (``fedweave history export``'s ``model.safetensors``)
into the coordinator's ``CHECKPOINT_DIR/study-models/RUN_ID/`` and pinned by its sha256 like
any initial model (``learning/initial_model.py``); every site then receives it as the run's
start, as it would a file of ``--study-files``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from fedweave.errors import UserError
from fedweave.history.operators import OperatorInfo

RUN_ID = re.compile(r"^[0-9a-f]{12}$")
"""A history run id as the coordinator makes them (no prefix, no ``latest``)."""
FOLDER = "study-models"


def run_model_for(
    store, operator: OperatorInfo | None, checkpoint_dir: Path, source: str
) -> Callable[[str], Path]:
    """``run_id → the run's final model file`` for studies ``operator`` submits (``None``: an
    operator removed since, who may read no run); ``UserError`` naming ``source``."""
    from fedweave.history.submissions import Submissions

    who = operator.name if operator is not None else "that operator"

    def model(run_id: str) -> Path:
        unseen = UserError(
            f"{source}: [training] initial_model names no run operator {who} may read; name "
            "one of its own runs (fedweave run list) or ask the coordinator's administrator "
            "for the role read-all"
        )
        if operator is None or not RUN_ID.match(run_id):
            raise unseen
        try:
            info = store.get_run(run_id)
        except UserError:
            raise unseen from None
        if info.run_id != run_id:
            raise unseen
        submitted = Submissions(store).of_run(run_id)
        own = submitted is not None and submitted.operator == operator.name
        if not (own or operator.may("read-all")):
            raise unseen
        out = checkpoint_dir.resolve() / FOLDER / run_id
        path = out / "model.safetensors"
        if not path.is_file():  # exported beside, then moved in whole
            import shutil
            import tempfile

            from fedweave.history.csv_export import export_run

            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                partial = Path(tempfile.mkdtemp(prefix=f".{run_id}-", dir=out.parent))
                try:
                    export_run(store, run_id, partial)
                    if (partial / path.name).is_file() and not path.is_file():
                        shutil.rmtree(out, ignore_errors=True)
                        partial.rename(out)
                finally:
                    shutil.rmtree(partial, ignore_errors=True)
            except OSError as exc:  # a full disk, a folder in the way: the operator's one line
                raise UserError(
                    f"{source}: [training] initial_model: run {run_id}'s model could not be "
                    f"written out on the coordinator ({exc.strerror or type(exc).__name__}); "
                    "submit it again later, or ask the coordinator's administrator (its "
                    "--checkpoint-dir)"
                ) from None
        if not path.is_file():
            raise UserError(
                f"{source}: [training] initial_model: run {run_id} has no recorded model to "
                "start from; name a run that completed a round"
            )
        return path

    return model
