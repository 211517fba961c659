"""Sites of unequal speed, on a simulated clock (``fedweave simulate --site-speeds SPEC``).

Each simulated site gets a compute factor and a link factor, drawn from the spread ``SPEC``
names and fixed by the run's seed and the site's name (so a site is as fast in every run
that compares methods on the same sites, whatever Flower's node ids). A site's job (one
round's local training plus sending its update and receiving the model) then takes, in
simulated seconds::

    compute factor x SECONDS_PER_EXAMPLE x examples x epochs
    + link factor x (model bytes + update bytes) / BYTES_PER_SECOND

(the update's bytes are the model's, or fewer under ``--compress``)

Both the coordinator and the site can compute it (the site knows its examples, the
coordinator learns them from the site's first reply), so a synchronous round's stragglers
are decided at the site and an asynchronous schedule orders arrivals by it. Time-to-accuracy
is then measured without waiting it out: each round records its simulated seconds beside the
wall-clock ones.

``SPEC``: ``equal`` (every factor 1), ``lognormal:SIGMA`` (each factor ``exp(N(0, SIGMA))``,
median 1) or ``pareto:ALPHA`` (each factor ``1 + Pareto(ALPHA)``: most sites near 1, a
heavy tail of slow ones; smaller ALPHA, heavier tail).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fedweave.errors import UserError

SECONDS_PER_EXAMPLE = 0.001
"""Simulated seconds one example of one local epoch costs a site of compute factor 1."""
BYTES_PER_SECOND = 10e6
"""Simulated link speed of a site of link factor 1 (10 MB/s each way)."""
KINDS = ("equal", "lognormal", "pareto")
MIN_WORK_FRACTION = 0.01
"""A site short of time still finishes at least this share of its work (and one step)."""


@dataclass(frozen=True)
class SiteSpeeds:
    """A spread of site speeds (``parse`` reads ``--site-speeds``).

    Attributes:
        kind: ``equal``, ``lognormal`` or ``pareto``.
        shape: SIGMA of ``lognormal``, ALPHA of ``pareto`` (unused for ``equal``).
        seed: the run's seed.
    """

    kind: str
    shape: float
    seed: int

    @classmethod
    def parse(cls, spec: str, seed: int) -> SiteSpeeds:
        """``--site-speeds SPEC`` for a run seeded ``seed``; a one-line error otherwise."""
        kind, _, shape_text = spec.strip().partition(":")
        usage = "use equal, lognormal:SIGMA (e.g. lognormal:1) or pareto:ALPHA (e.g. pareto:1.5)"
        if kind not in KINDS:
            raise UserError(f"--site-speeds {spec!r}: unknown spread '{kind}'; {usage}")
        if kind == "equal":
            if shape_text:
                raise UserError(f"--site-speeds {spec!r}: equal takes no parameter; {usage}")
            return cls(kind, 0.0, seed)
        try:
            shape = float(shape_text)
        except ValueError:
            raise UserError(f"--site-speeds {spec!r}: '{shape_text}' is not a number; {usage}") \
                from None
        if not np.isfinite(shape) or shape <= 0:
            raise UserError(f"--site-speeds {spec!r}: the parameter must be above 0; {usage}")
        return cls(kind, shape, seed)

    @property
    def spec(self) -> str:
        return "equal" if self.kind == "equal" else f"{self.kind}:{self.shape:g}"

    def factors(self, site: str) -> tuple[float, float]:
        """(compute factor, link factor) of the site named ``site``: larger is slower."""
        if self.kind == "equal":
            return 1.0, 1.0
        digest = hashlib.sha256(f"{self.seed}:{site}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        if self.kind == "lognormal":
            draws = rng.lognormal(0.0, self.shape, size=2)
        else:
            draws = 1.0 + rng.pareto(self.shape, size=2)
        return float(draws[0]), float(draws[1])

    def job_seconds(
        self, site: str, examples: int, epochs: int, model_bytes: int,
        update_bytes: int | None = None,
    ) -> float:  # fmt: skip
        """Simulated seconds of one round's job at ``site``: its local training on
        ``examples`` for ``epochs``, the model down (``model_bytes``) and its update up
        (``update_bytes``: what ``--compress`` sends; default the model's bytes)."""
        return sum(self.compute_and_link(site, examples, epochs, model_bytes, update_bytes))

    def compute_and_link(
        self, site: str, examples: int, epochs: int, model_bytes: int,
        update_bytes: int | None = None,
    ) -> tuple[float, float]:  # fmt: skip
        """The two parts of ``job_seconds``: (training, transfer)."""
        compute, link = self.factors(site)
        up = model_bytes if update_bytes is None else update_bytes
        return (
            compute * SECONDS_PER_EXAMPLE * examples * epochs,
            link * (model_bytes + up) / BYTES_PER_SECOND,
        )


def share_done_by(deadline: float, training: float, transfer: float) -> float:
    """The share of its local training a site finishes when its round closes ``deadline``
    simulated seconds after it starts and sending takes ``transfer``; 1 when it is on time,
    0 when not even sending fits."""
    if training + transfer <= deadline:
        return 1.0
    return max(0.0, min(1.0, (deadline - transfer) / training)) if training > 0 else 0.0
