"""Tasks installed as Python packages: found by name through the ``fedweave.tasks`` entry
point group, and pinned by package and version.

A task package (docs/tasks.md has the template) declares in its ``pyproject.toml``::

    [project.entry-points."fedweave.tasks"]
    diabetes = "clinic_task:task"

Once it is installed (``pip install ./clinic-task``) at the coordinator and at every site,
``--task diabetes`` finds it everywhere. A run pins the package's name and version with the
task (``pinned_package``); a site with another version installed refuses the run, naming
both (``package_problem``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from fedweave.errors import UserError

GROUP = "fedweave.tasks"
"""The entry point group a task package registers its tasks in."""


@dataclass(frozen=True)
class TaskPackage:
    """One task an installed package registers.

    Attributes:
        name: the task's name (``--task NAME``).
        target: what it points to, ``module:attr``.
        package: the distribution that registers it.
        version: that distribution's version.
    """

    name: str
    target: str
    package: str
    version: str

    def pinned(self) -> dict[str, str]:
        return {"task": self.name, "package": self.package, "version": self.version}


def installed_tasks() -> dict[str, TaskPackage]:
    """Every task the installed packages register, by name. Two packages registering one
    name is refused, naming both (which one ran would depend on the install order)."""
    found: dict[str, TaskPackage] = {}
    for entry in metadata.entry_points(group=GROUP):
        dist = entry.dist
        package = dist.name if dist is not None else "an unnamed package"
        version = dist.version if dist is not None else "unknown"
        task = TaskPackage(entry.name, entry.value, package, version)
        earlier = found.get(entry.name)
        if earlier is not None and earlier.package != package:
            raise UserError(
                f"task '{entry.name}' is registered by two installed packages, "
                f"{earlier.package} {earlier.version} and {package} {version}; uninstall one "
                f"(pip uninstall {package})"
            )
        found[entry.name] = task
    return found


def installed_task(name: str) -> TaskPackage | None:
    """The installed package's task called ``name``, or ``None``."""
    return installed_tasks().get(name)


def pinned_package(spec: str) -> dict[str, str] | None:
    """What a run pins of task ``spec`` when an installed package provides it (its name, the
    package and its version), else ``None``."""
    task = installed_task(spec) if ":" not in spec else None
    return task.pinned() if task is not None else None


def package_problem(pinned: dict[str, str] | None) -> str | None:
    """Why this site cannot take part in a run that pinned the task package ``pinned``
    (``TaskPackage.pinned``: another version installed here, or none), or ``None``."""
    if not pinned:
        return None
    spec = str(pinned.get("task"))
    here = pinned_package(spec)
    wanted = f"{pinned.get('package')} {pinned.get('version')}"
    if here is None:
        return (
            f"the run's task '{spec}' is {wanted}, which is not installed at this site; "
            f"pip install '{pinned.get('package')}=={pinned.get('version')}' here"
        )
    if (here["package"], here["version"]) != (pinned.get("package"), pinned.get("version")):
        return (
            f"the run's task '{spec}' is {wanted}, this site has {here['package']} "
            f"{here['version']}; install the run's version here (pip install "
            f"'{pinned.get('package')}=={pinned.get('version')}') or start the run with this one"
        )
    return None


def pinned_for_run(spec: str, recorded: dict[str, str] | None = None) -> dict[str, str] | None:
    """What a run of task ``spec`` pins (``pinned_package``); resuming a run that ``recorded``
    another package version is refused, naming both (its rounds were trained with that
    code)."""
    pinned = pinned_package(spec)
    if recorded and recorded != pinned:
        here = f"{pinned['package']} {pinned['version']}" if pinned else "no such package"
        raise UserError(
            f"the run's task '{recorded.get('task')}' was {recorded.get('package')} "
            f"{recorded.get('version')} and this machine has {here}; install the run's version "
            f"(pip install '{recorded.get('package')}=={recorded.get('version')}') to resume it"
        )
    return pinned
