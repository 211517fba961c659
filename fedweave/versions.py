"""Which fedweave and Flower this install runs, and which coordinators its sites take runs from.

A coordinator writes its versions into every run's config (``contract.RUN_VERSIONS_KEY``); each
site compares them with its own before it reads anything else of the run
(``client.mods.version_guard``) and refuses a run it cannot speak to, naming both sides'
versions and the fix, which the coordinator records against the site's name.

Two installs speak to each other when both run the same fedweave release line (major.minor:
what ``contract.py``'s keys mean) and the same Flower release line: Flower itself expects its
SuperLink and SuperNodes on one major.minor (``flwr.supercore.runtime_version_compatibility``),
and fedweave's SecAgg+ and message records are written for one Flower release
(``fedweave.flower_patches.PATCHED_FLOWER_VERSION``, the one ``pyproject.toml`` pins, checked
at import).
"""

from __future__ import annotations

import re
from importlib import metadata


def running() -> tuple[str, str]:
    """(fedweave's version, the installed Flower's; ``none`` where Flower is missing)."""
    from fedweave import __version__

    try:
        flower = metadata.version("flwr")
    except metadata.PackageNotFoundError:
        flower = "none"
    return __version__, flower


def described(versions: tuple[str, str] | None = None) -> str:
    """``fedweave 0.1.0, flwr 1.42.0``: what a run's config and a refusal say of one side."""
    fedweave, flower = versions or running()
    return f"fedweave {fedweave}, flwr {flower}"


VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]{0,39}$")
"""What a version looks like (PEP 440's characters, bounded): a coordinator's run config is
its word, and a refusal repeats only what matches this."""


def parse_described(text: str) -> tuple[str, str] | None:
    """The versions ``described`` wrote, or ``None`` for anything else."""
    if len(text) > 200:
        return None
    parts = dict(part.strip().partition(" ")[::2] for part in text.split(","))
    fedweave, flower = parts.get("fedweave", ""), parts.get("flwr", "")
    return (fedweave, flower) if VERSION.match(fedweave) and VERSION.match(flower) else None


def release_line(version: str) -> tuple[str, ...]:
    """A version's major.minor (``0.1.0`` → ``("0", "1")``)."""
    return tuple(version.split(".")[:2])


def mismatch(coordinator: str | None, site: tuple[str, str] | None = None) -> str | None:
    """Why a site with ``site``'s versions cannot take a run whose coordinator wrote
    ``coordinator`` (``described``; ``None``: a coordinator older than this check), or None."""
    fedweave, flower = site or running()
    theirs = parse_described(coordinator) if coordinator is not None else None
    if theirs is None:
        said = "does not say its versions" if coordinator is None else "sent versions that are not"
        return (
            f"the coordinator {said} (a fedweave older than this site's {fedweave}); this "
            f"site runs {described((fedweave, flower))}: install the same fedweave at the "
            "coordinator and every site"
        )
    if (release_line(theirs[0]), release_line(theirs[1])) == (
        release_line(fedweave),
        release_line(flower),
    ):
        return None
    return (
        f"the coordinator runs {described(theirs)} and this site {described((fedweave, flower))}: "
        f"install the coordinator's release at this site (pip install 'fedweave=={theirs[0]}' "
        f"'flwr=={theirs[1]}'), or the site's at the coordinator"
    )
