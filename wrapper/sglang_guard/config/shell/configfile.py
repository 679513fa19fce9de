"""Find and read the guard's TOML config (explicit path, $SGLANG_GUARD_CONFIG, default places)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from sglang_guard.common.shell.files import read_user_text
from sglang_guard.config.guardconfig import GuardConfig, parse_guard_config
from sglang_guard.errors import ConfigError

SYSTEM_CONFIG = "/etc/sglang-guard/guard.toml"


def user_config() -> Path:
    """The per-user config: $XDG_CONFIG_HOME/sglang-guard/guard.toml."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sglang-guard" / "guard.toml"


def locate(explicit: str | None, *, search_defaults: bool) -> str | None:
    """The config to use: `explicit`, else $SGLANG_GUARD_CONFIG, else (if asked) the defaults."""
    if explicit:
        return explicit
    env = os.environ.get("SGLANG_GUARD_CONFIG")
    if env:
        return env
    if search_defaults:
        for candidate in (Path(SYSTEM_CONFIG), user_config()):
            if candidate.is_file():
                return str(candidate)
    return None


def read_guard_config(path: str | None) -> GuardConfig:
    """Parse the file at `path` (None: all defaults)."""
    if path is None:
        return GuardConfig()
    text = read_user_text(path, "a TOML file", partial(ConfigError, path, None))
    return parse_guard_config(text, path)
