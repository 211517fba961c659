"""``synthetic-A-B``: the Synthetic(α, β) data of the FedProx paper, generated offline, per site.

Li et al., "Federated Optimization in Heterogeneous Networks" (MLSys 2020), section 5.1, and
their generator (``data/synthetic_*/generate_synthetic.py`` in the FedProx repository):

- every site ``k`` has a local model ``y = argmax(softmax(W_k x + b_k))`` with 60 features and
  10 classes, ``W_k ~ N(u_k, 1)``, ``b_k ~ N(u_k, 1)``, ``u_k ~ N(0, α)``: α sets how much the
  sites' local models differ;
- its features are ``x ~ N(v_k, Σ)`` with ``Σ = diag(j^-1.2)``, ``v_k ~ N(B_k, 1)``,
  ``B_k ~ N(0, β)``: β sets how much the sites' local data differ;
- its example count is ``int(lognormal(4, 2)) + 50`` (a power law: a few sites hold most data);
- ``synthetic-iid``: one model ``W, b ~ N(0, 1)`` and ``x ~ N(0, Σ)`` for every site;
- each site keeps 90% of its examples for training and 10% for testing; the task's test set is
  every site's 10%, as the paper evaluates.

Where fedweave differs from that script, on purpose:

- site ``k``'s draws come from its own generator seeded by ``(seed, k)``, so a site's data does
  not depend on how many sites there are (the paper draws every site from one global stream
  for a fixed 30 sites); the distributions are the same, the numbers are not;
- ``x`` is drawn as ``v_k + sqrt(diag Σ) · z`` rather than with ``multivariate_normal``: the
  same distribution for a diagonal Σ, and fast for 5,000 sites;
- the paper's α and β are standard deviations (``np.random.normal(0, alpha)``); so are ours.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from fedweave.errors import UserError
from fedweave.learning.task import ArrayData
from fedweave.learning.tasks.classification import ClassificationTask

if TYPE_CHECKING:
    from torch import nn

FEATURES = 60
CLASSES = 10
PAPER_SITES = 30
"""Sites the paper generates; ``load_data`` (a task's pooled data) uses that many."""
TEST_FRACTION = 0.1
NAMED_VARIANTS = ("synthetic-0-0", "synthetic-0.5-0.5", "synthetic-1-1", "synthetic-iid")
_NAME = re.compile(r"synthetic-(?P<alpha>[0-9]+(?:\.[0-9]+)?)-(?P<beta>[0-9]+(?:\.[0-9]+)?)")


def feature_scales() -> np.ndarray:
    """Standard deviation of each feature: ``sqrt(j^-1.2)`` for ``j = 1 .. 60``."""
    return np.power(np.arange(1, FEATURES + 1, dtype=np.float64), -1.2) ** 0.5


def site_example_count(rng: np.random.Generator) -> int:
    return int(rng.lognormal(4, 2)) + 50


class SyntheticTask(ClassificationTask):
    """Synthetic(α, β) as a task: multinomial logistic regression, as in the paper.

    Args:
        alpha: spread of the sites' local models (standard deviation, >= 0).
        beta: spread of the sites' local feature means (standard deviation, >= 0).
        iid: one model and one feature distribution for every site (``synthetic-iid``).
    """

    input_shape = (FEATURES,)
    num_classes = CLASSES

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, iid: bool = False) -> None:
        self.alpha, self.beta, self.iid = alpha, beta, iid
        self.name = "synthetic-iid" if iid else f"synthetic-{alpha:g}-{beta:g}"

    @classmethod
    def from_name(cls, name: str) -> SyntheticTask:
        """``synthetic-iid`` or ``synthetic-A-B`` (α = A, β = B, non-negative numbers)."""
        if name == "synthetic-iid":
            return cls(0.0, 0.0, iid=True)
        match = _NAME.fullmatch(name)
        if match is None:
            raise UserError(
                f"unknown synthetic task '{name}': use synthetic-A-B with non-negative numbers "
                f"A (α, how much the sites' models differ) and B (β, how much their data "
                f"differ), e.g. {', '.join(NAMED_VARIANTS)}"
            )
        return cls(float(match["alpha"]), float(match["beta"]))

    def build_model(self) -> nn.Module:
        from torch import nn

        return nn.Linear(FEATURES, CLASSES)

    def _shared_model(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([seed, 2**31])  # apart from every site's stream
        return rng.normal(0, 1, (FEATURES, CLASSES)), rng.normal(0, 1, CLASSES)

    def site_data(self, site: int, seed: int = 0) -> tuple[ArrayData, ArrayData]:
        """Site ``site``'s (train, test) examples; the same for a given ``(seed, site)``."""
        rng = np.random.default_rng([seed, site])
        count = site_example_count(rng)
        if self.iid:
            weights, bias = self._shared_model(seed)
            mean = np.zeros(FEATURES)
        else:
            model_mean = rng.normal(0, self.alpha)
            data_mean = rng.normal(0, self.beta)
            mean = rng.normal(data_mean, 1, FEATURES)
            weights = rng.normal(model_mean, 1, (FEATURES, CLASSES))
            bias = rng.normal(model_mean, 1, CLASSES)
        x = mean + feature_scales() * rng.standard_normal((count, FEATURES))
        y = np.argmax(x @ weights + bias, axis=1)  # softmax keeps the argmax
        data = ArrayData(x.astype(np.float32), y.astype(np.int64))
        order = rng.permutation(count)
        cut = int(round(count * (1 - TEST_FRACTION)))
        return data.subset(np.sort(order[:cut])), data.subset(np.sort(order[cut:]))

    def load_data(self) -> tuple[ArrayData, ArrayData]:
        """The pooled train and test examples of the paper's 30 sites (seed 0)."""
        parts = [self.site_data(site) for site in range(PAPER_SITES)]
        return concatenate([p[0] for p in parts]), concatenate([p[1] for p in parts])


def concatenate(parts: list[ArrayData]) -> ArrayData:
    return ArrayData(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]))
