"""What each ``--dp`` mode's epsilon is a statement about: the neighbouring relation, the
sensitivity its noise is sized for, the accountant, and where the noise comes from. The run
header, the ledger's records, ``history show`` and an exported ``model.json`` all say these
(docs/privacy.md)."""

from __future__ import annotations

from fedweave.privacy_accounting import ACCOUNTANT

RELATIONS = {
    "central": "add-or-remove-one site",
    "local": "replace-one (any two inputs of a site)",
    "sample": "add-or-remove-one example (at each site)",
}
"""``--dp`` mode → the neighbouring relation its epsilon is stated for."""
SENSITIVITY = {
    "central": "C/m: clipping norm over the planned cohort (a fixed denominator)",
    "local": "2C: twice the clipping norm (any two clipped updates)",
    "sample": "C: each example's clipped gradient, per DP-SGD step",
}
"""``--dp`` mode → the L2 sensitivity its noise is sized for."""
ACCOUNTANTS = {
    "central": ACCOUNTANT,
    "local": ACCOUNTANT,
    "sample": "rdp (Opacus's RDPAccountant at each site, on its own ledger)",
}
"""``--dp`` mode → who composes its releases (sample: each site, for its own examples)."""
SITES_REPORT_UNDER_DP = (
    "their noised updates only: no example counts (every site weighs alike) and no training "
    "metrics"
)
"""What a site sends beside its update under any ``--dp`` (``client/site_app.py``)."""
NOISE_SOURCE = "fresh from a secret key (os.urandom, AES-CTR): a seeded run does not repeat"
"""Where every mode's noise comes from (``fedweave/privacy/noise.py``)."""


def statement(mode: str) -> dict[str, str]:
    """``{"relation", "sensitivity", "accountant", "noise"}`` of ``--dp mode`` (``{}``: none)."""
    if mode not in RELATIONS:
        return {}
    return {
        "relation": RELATIONS[mode],
        "sensitivity": SENSITIVITY[mode],
        "accountant": ACCOUNTANTS[mode],
        "noise": NOISE_SOURCE,
    }
