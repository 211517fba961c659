"""One config for every command: each option declared once with its bounds (``sections.py``),
each rule across options declared once (``rules.py``) and run by every command that takes its
options, read from flags or a TOML file (``commands.py``, ``files.py``), stored with the run and
merged on resume by one policy (``resume.py``)."""

from fedweave.config.commands import Resolved, config_command
from fedweave.config.run_config import SETTINGS, RunConfig
from fedweave.config.sections import COMMAND_SETTINGS

__all__ = ["COMMAND_SETTINGS", "SETTINGS", "Resolved", "RunConfig", "config_command"]
