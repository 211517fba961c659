"""A site's policy: the file a site owns that says which runs it takes part in (issue 38).

``fedweave client --policy site-policy.toml`` names it. Every key is optional; a key left out
allows everything it would limit::

    # which of the tasks this site holds it trains (its --task and --more-tasks)
    tasks = ["heart", "digits"]
    # whose runs: operators' names (`fedweave run submit`), and "coordinator" for the
    # coordinator's own command-line run
    operators = ["alice", "coordinator"]
    # when, in UTC: HH:MM-HH:MM windows (one may pass midnight, "22:00-06:00")
    hours = ["08:00-18:00"]
    # the privacy floor, as the flags --require-secure-agg, --require-dp, --max-epsilon say
    require_secure_agg = true
    require_dp = "any"
    max_epsilon = 8.0
    # the most delta a DP run may state its epsilon at (default: 1 / (10 x the site's
    # training examples), which the site checks itself)
    max_delta = 1e-5
    # the most a job may ask of this site's time: local epochs a round
    max_local_epochs = 5

The site checks it when it starts (a file that does not parse, or a key or value it does not
know, ends the site with one line naming it) and reads it again whenever it changes, so the
site's operator may tighten or loosen it while the site serves. A message of a run the policy
does not allow is refused before anything else is read, with the reason; the coordinator
records the site ``refused`` with that reason, and the site's console says it once a run.
The privacy floor adds to the flags': the stricter of the two holds.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import datetime, time, timezone
from pathlib import Path

from fedweave.contract import COMMAND_LINE_OPERATOR
from fedweave.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REQUIRE_DP_ORDER = ("off", "any", "local", "sample")
"""``require_dp`` values, weakest first (``--require-dp``)."""
MAX_POLICY_BYTES = 64 * 1024
KEYS = (
    "tasks", "operators", "hours", "require_secure_agg", "require_dp", "max_epsilon", "max_delta",
    "max_local_epochs",
)  # fmt: skip


@dataclass(frozen=True)
class SitePolicy:
    """A parsed site policy; ``None`` fields allow everything (see the module docstring)."""

    source: str
    tasks: tuple[str, ...] | None = None
    operators: tuple[str, ...] | None = None
    hours: tuple[tuple[time, time], ...] | None = None
    require_secure_agg: bool = False
    require_dp: str = "off"
    max_epsilon: float | None = None
    max_delta: float | None = None
    max_local_epochs: int | None = None

    def job_refusal(self, config: dict) -> str | None:
        """Why this policy refuses a training job whose round config is ``config`` (it asks
        more of the site's time than the policy allows); ``None``: it takes it."""
        from fedweave.contract import LOCAL_EPOCHS_KEY

        asked = config.get(LOCAL_EPOCHS_KEY)
        if self.max_local_epochs is None or asked is None:
            return None
        try:
            epochs = int(asked)
        except (TypeError, ValueError):
            return f"the run's local epochs {str(asked)[:40]!r} are not a whole number"
        if epochs > self.max_local_epochs:
            return (
                f"this site's policy ({self.source}) allows at most {self.max_local_epochs} "
                f"local epochs a round, and the run asks {epochs}"
            )
        return None

    def refusal(self, task: str, operator: str | None, now: datetime | None = None) -> str | None:
        """Why this policy refuses a run of ``task`` submitted by ``operator`` (``None``: the
        coordinator's command-line run) at ``now`` (UTC; default: the clock); ``None``: it
        takes part. The privacy floor is not checked here (``floor``)."""
        who = operator if operator is not None else COMMAND_LINE_OPERATOR
        if self.tasks is not None and task not in self.tasks:
            return (
                f"this site's policy ({self.source}) trains tasks {', '.join(self.tasks)} only, "
                f"not '{task}'"
            )
        if self.operators is not None and who not in self.operators:
            whose = f"operator {who}'s" if operator is not None else "the coordinator's own"
            return (
                f"this site's policy ({self.source}) takes runs of "
                f"{', '.join(self.operators)} only, not {whose} run"
            )
        if self.hours is not None:
            clock = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).time()
            if not any(_within(clock, start, end) for start, end in self.hours):
                windows = ", ".join(f"{a:%H:%M}-{b:%H:%M}" for a, b in self.hours)
                return (
                    f"this site's policy ({self.source}) trains in {windows} UTC only; it is "
                    f"{clock:%H:%M} UTC"
                )
        return None

    def floor(
        self, node_floor: dict[str, str], keys: tuple[str, str, str, str]
    ) -> dict[str, str]:
        """The site's privacy floor (node-config entries ``keys``: require secure aggregation,
        require DP, max epsilon, max delta) with this policy's added: the stricter of each
        holds."""
        secure_key, dp_key, epsilon_key, delta_key = keys
        floor = dict(node_floor)
        if self.require_secure_agg:
            floor[secure_key] = "true"
        given = str(floor.get(dp_key, "off"))
        if REQUIRE_DP_ORDER.index(self.require_dp) > REQUIRE_DP_ORDER.index(
            given if given in REQUIRE_DP_ORDER else "off"
        ):
            floor[dp_key] = self.require_dp
        if self.max_epsilon is not None:
            old = floor.get(epsilon_key)
            if old is None or self.max_epsilon < float(old):
                floor[epsilon_key] = repr(self.max_epsilon)
        if self.max_delta is not None:
            old = floor.get(delta_key)
            if old is None or self.max_delta < float(old):
                floor[delta_key] = repr(self.max_delta)
        return floor


def _within(clock: time, start: time, end: time) -> bool:
    if start <= end:
        return start <= clock < end
    return clock >= start or clock < end  # a window across midnight


def _names(value: object, key: str, source: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UserError(f'{source}: {key} must be a list of names, e.g. {key} = ["a", "b"]')
    return tuple(value)


def _window(text: object, source: str) -> tuple[time, time]:
    problem = UserError(
        f'{source}: hours entry {text!r} is not HH:MM-HH:MM (UTC), e.g. "08:00-18:00"'
    )
    if not isinstance(text, str) or text.count("-") != 1:
        raise problem
    try:
        start, end = (time.fromisoformat(part.strip()) for part in text.split("-"))
    except ValueError:
        raise problem from None
    if start == end:
        raise UserError(f"{source}: hours entry {text!r} is empty; give a window that is not")
    return start, end


def parse_policy(text: str, source: str) -> SitePolicy:
    """The policy in ``text`` (TOML; ``source`` names it in errors); ``UserError`` with one
    line for anything it does not say right."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{source} is not TOML ({exc}); fix its syntax") from None
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise UserError(
            f"{source}: unknown key {unknown[0]!r}; a site policy says {', '.join(KEYS)}"
        )
    tasks = _names(table["tasks"], "tasks", source) if "tasks" in table else None
    operators = _names(table["operators"], "operators", source) if "operators" in table else None
    hours = None
    if "hours" in table:
        if not isinstance(table["hours"], list) or not table["hours"]:
            raise UserError(f'{source}: hours must be a list of windows, e.g. ["08:00-18:00"]')
        hours = tuple(_window(entry, source) for entry in table["hours"])
    secure = table.get("require_secure_agg", False)
    if not isinstance(secure, bool):
        raise UserError(f"{source}: require_secure_agg must be true or false")
    dp = table.get("require_dp", "off")
    if dp not in REQUIRE_DP_ORDER:
        raise UserError(f"{source}: require_dp must be one of {', '.join(REQUIRE_DP_ORDER)}")
    epsilon = table.get("max_epsilon")
    if epsilon is not None and (
        isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0
    ):
        raise UserError(f"{source}: max_epsilon must be a number above 0")
    delta = table.get("max_delta")
    if delta is not None and (
        isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1
    ):
        raise UserError(f"{source}: max_delta must be a number between 0 and 1, e.g. 1e-5")
    epochs = table.get("max_local_epochs")
    if epochs is not None and (
        isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1
    ):
        raise UserError(f"{source}: max_local_epochs must be a whole number of at least 1")
    return SitePolicy(
        source, tasks, operators, hours, secure, dp,
        float(epsilon) if epsilon is not None else None,
        float(delta) if delta is not None else None, epochs,
    )  # fmt: skip


def read_policy(path: Path) -> SitePolicy:
    """The policy file at ``path``; ``UserError`` with one line where it cannot be read or
    does not parse."""
    try:
        if path.stat().st_size > MAX_POLICY_BYTES:
            raise UserError(f"site policy {path} is over {MAX_POLICY_BYTES // 1024} KB")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UserError(
            f"site policy {path} cannot be read ({exc.strerror}); fix --policy"
        ) from None
    except UnicodeDecodeError:
        raise UserError(f"site policy {path} is not UTF-8 text") from None
    return parse_policy(text, path.name)


class PolicyFile:
    """A policy file read again whenever it changes (its size, modification time or inode)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._policy: SitePolicy | None = None
        self._problem: str | None = None

    def current(self) -> SitePolicy:
        """The policy as the file says now; ``UserError`` with its problem where the file no
        longer reads (every run is then refused with it, until the site fixes the file)."""
        try:
            info = os.stat(self.path)
            seen = (info.st_mtime_ns, info.st_size, info.st_ino)
        except OSError:
            seen = None
        if seen is None or seen != self._seen:
            self._seen = seen
            try:
                self._policy, self._problem = read_policy(self.path), None
            except UserError as exc:
                self._policy, self._problem = None, str(exc)
        if self._problem is not None:
            raise UserError(self._problem)
        return self._policy  # type: ignore[return-value]
