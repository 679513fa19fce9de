"""Loading the rule packs a guard config names (the default pack first, unless disabled)."""

from __future__ import annotations

from functools import partial

from sglang_guard.core.guardconfig import GuardConfig
from sglang_guard.core.rules import RulePack, load_default_packs, parse_pack
from sglang_guard.errors import ConfigError
from sglang_guard.shell.files import read_user_text


def load_packs(cfg: GuardConfig) -> tuple[RulePack, ...]:
    """The default packs (unless disabled) and the packs the guard config names."""
    packs = list(load_default_packs()) if cfg.rules.default_pack else []
    for path in cfg.rules.packs:
        text = read_user_text(path, "a rule pack (TOML)", partial(ConfigError, path, None))
        packs.append(parse_pack(text, path))
    return tuple(packs)
