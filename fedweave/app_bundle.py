"""What a run's Flower App Bundle (FAB) may be: fedweave's own apps by name, and no code.

Code never travels: the coordinator's SuperLink refuses to start a run whose bundle is
anything else (``fedweave.flower_patches.run_bundles``), and a site's ClientApp worker
refuses to run one (``fedweave.client.worker``), whoever submitted it. Both ask this module.
"""

from __future__ import annotations

import io
import zipfile

SERVER_APP_REF = "fedweave.coordinator.serverapp.deployed_server_app:server_app"
CLIENT_APP_REF = "fedweave.client.deployed_app:app"
"""The apps a fedweave bundle names (``fedweave.contract`` gives them to both sides). Declared
here, not there, because the contract reads Flower's error codes through
``fedweave.flower_patches``, whose SuperLink patch asks this module: the arrows stay one way."""

ALLOWED_FILES = frozenset({"pyproject.toml", "README.md", ".info/CONTENT"})
"""The files ``fedweave.coordinator.command.superlink.build_fab`` writes; anything else could be
imported by Flower's loader (a ``.py`` beside the app shadows an installed module)."""
MAX_BUNDLE_BYTES = 1 << 20
"""fedweave's bundles are a few KiB of settings; Flower itself allows 100 MB."""


def bundle_problem(fab: bytes) -> str | None:
    """Why ``fab`` is not a fedweave run's bundle, or None when it is."""
    if len(fab) > MAX_BUNDLE_BYTES:
        return f"the bundle is {len(fab)} bytes (fedweave's carry settings only, < 1 MiB)"
    try:
        with zipfile.ZipFile(io.BytesIO(fab)) as archive:
            names = set(archive.namelist())
            extra = sorted(names - ALLOWED_FILES)
            if extra:
                return f"the bundle carries files ({', '.join(extra[:3])}); code never travels"
            pyproject = archive.read("pyproject.toml").decode("utf-8")
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, OSError):
        return "the bundle is not a FAB with a pyproject.toml"
    import tomli  # Flower's own TOML reader (stdlib tomllib is 3.11+)

    try:
        components = tomli.loads(pyproject)["tool"]["flwr"]["app"]["components"]
    except (tomli.TOMLDecodeError, KeyError, TypeError):
        return "the bundle's pyproject.toml names no [tool.flwr.app.components]"
    wanted = {"serverapp": SERVER_APP_REF, "clientapp": CLIENT_APP_REF}
    for role, ref in wanted.items():
        if components.get(role) != ref:
            return f"the bundle names {role} {components.get(role)!r}, not fedweave's {ref!r}"
    return None
