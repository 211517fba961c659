"""``RunConfig``: one value per setting, grouped by section; conversions to and from the
flat field names, the stored (JSON/TOML-safe) form, and value checks shared by flags and files."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedweave.config.fields import Meta, flag_name, meta_of
from fedweave.config.sections import (
    SECTIONS,
    ConnectionSection,
    DataSection,
    DeploymentSection,
    EvaluationSection,
    FederationSection,
    GossipSection,
    HistoryConfigSection,
    MonitoringSection,
    OutputSection,
    PeerSection,
    PrivacySection,
    SecureAggregationSection,
    SimulationSection,
    SiteSection,
    TrainingSection,
)
from fedweave.errors import UserError


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a run, by section (``fedweave/config/sections.py`` documents each)."""

    data: DataSection = field(default_factory=DataSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    federation: FederationSection = field(default_factory=FederationSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    secure_aggregation: SecureAggregationSection = field(
        default_factory=SecureAggregationSection
    )
    privacy: PrivacySection = field(default_factory=PrivacySection)
    gossip: GossipSection = field(default_factory=GossipSection)
    history: HistoryConfigSection = field(default_factory=HistoryConfigSection)
    simulation: SimulationSection = field(default_factory=SimulationSection)
    connection: ConnectionSection = field(default_factory=ConnectionSection)
    deployment: DeploymentSection = field(default_factory=DeploymentSection)
    site: SiteSection = field(default_factory=SiteSection)
    peer: PeerSection = field(default_factory=PeerSection)
    monitoring: MonitoringSection = field(default_factory=MonitoringSection)
    output: OutputSection = field(default_factory=OutputSection)

    def value(self, name: str) -> Any:
        """A setting by its (unique) field name."""
        return getattr(getattr(self, SETTINGS[name].section), name)

    def replace(self, **values: Any) -> RunConfig:
        """A copy with the given settings (by field name) changed."""
        by_section: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            if name not in SETTINGS:
                raise KeyError(f"no setting named {name!r}")
            by_section.setdefault(SETTINGS[name].section, {})[name] = value
        changed = {
            section: dataclasses.replace(getattr(self, section), **fields)
            for section, fields in by_section.items()
        }
        return dataclasses.replace(self, **changed)

    @classmethod
    def of(cls, **values: Any) -> RunConfig:
        """Defaults with these settings (by field name): ``RunConfig.of(clients=3, lr=0.05)``."""
        return cls().replace(**values)

    def stored(self, names: typing.Iterable[str]) -> dict[str, dict[str, Any]]:
        """The TOML/JSON-safe ``{section: {field: value}}`` of ``names`` that are stored with a
        run (secrets and one-off switches are not); None values are left out."""
        out: dict[str, dict[str, Any]] = {}
        for name in names:
            setting = SETTINGS[name]
            value = self.value(name)
            if not setting.meta.stored or value is None:
                continue
            out.setdefault(setting.section, {})[name] = str(value) if isinstance(
                value, Path
            ) else value
        return out


@dataclass(frozen=True)
class Setting:
    """One declared option: where it lives, its type, default and metadata."""

    name: str
    section: str
    type: Any
    default: Any
    meta: Meta

    @property
    def flag(self) -> str:
        return flag_name(self.name)

    @property
    def base_type(self) -> type:
        """The type without ``| None``."""
        args = [a for a in typing.get_args(self.type) if a is not type(None)]
        return args[0] if args else self.type

    @property
    def optional(self) -> bool:
        return type(None) in typing.get_args(self.type)


def _collect() -> dict[str, Setting]:
    found: dict[str, Setting] = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in found:
                raise TypeError(f"setting {f.name!r} is declared in two sections")
            found[f.name] = Setting(f.name, section, hints[f.name], f.default, meta_of(f))
    return found


SETTINGS: dict[str, Setting] = _collect()
"""Field name → its declaration, for every setting of every section."""


def coerce(setting: Setting, value: Any, where: str) -> Any:
    """``value`` (from a config file or stored config) as the setting's type, or a one-line
    ``UserError`` naming ``where`` and what was expected."""
    if value is None and setting.optional:
        return None
    kind = setting.base_type
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        Path: lambda v: isinstance(v, (str, Path)),
    }[kind](value)
    if not ok:
        expected = {bool: "true or false", int: "an integer", float: "a number",
                    str: "a string", Path: "a path (string)"}[kind]
        raise UserError(f"{where} = {value!r}: expected {expected}")
    return kind(value)


def check_value(setting: Setting, value: Any, where: str, command: str | None = None) -> None:
    """Refuse a value outside the setting's choices or bounds (those of ``command``, when a
    bound differs by command), naming ``where`` it came from."""
    meta = setting.meta
    if value is None:
        return
    if meta.choices is not None and value not in meta.choices:
        raise UserError(f"{where} {value!r} is unknown: use one of {', '.join(meta.choices)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        minimum = meta.minimum_for(command)
        if minimum is not None and value < minimum:
            raise UserError(f"{where} must be at least {minimum:g}, got {value:g}")
        if meta.maximum is not None and value > meta.maximum:
            raise UserError(f"{where} must be at most {meta.maximum:g}, got {value:g}")
        if meta.above is not None and not value > meta.above:
            raise UserError(f"{where} must be > {meta.above:g}, got {value:g}")
        if meta.below is not None and not value < meta.below:
            raise UserError(f"{where} must be < {meta.below:g}, got {value:g}")
