"""Loading the rule packs a guard config names (the default pack first, unless disabled)."""

from __future__ import annotations

import functools
import json
from functools import partial

from sglang_guard.common.shell.files import read_user_text
from sglang_guard.config.guardconfig import GuardConfig
from sglang_guard.errors import ConfigError
from sglang_guard.resources import config_path
from sglang_guard.rules.packcheck import check_allow_set, check_pack, release_to_check
from sglang_guard.rules.rules import RulePack, load_default_packs, parse_pack
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.releases import known_releases, load_option_table


def load_packs(cfg: GuardConfig, running: OptionTable | None = None) -> tuple[RulePack, ...]:
    """The default packs (unless disabled) and the packs the guard config names, each checked
    against the running release's option table (or, for a pack whose range does not hold
    it, the newest shipped release its range holds)."""
    packs = list(load_default_packs()) if cfg.rules.default_pack else []
    for path in cfg.rules.packs:
        text = read_user_text(path, "a rule pack (TOML)", partial(ConfigError, path, None))
        packs.append(parse_pack(text, path))
    check_allow_set(cfg.rules.allow_set, running or load_option_table(), cfg.path)
    allow = frozenset(cfg.rules.allow_set)
    return tuple(check_pack(p, _table_for(p, running), allow, other_release_has)
                 for p in packs)


SPELLINGS_FILE = ("sglang", "spellings.json")


@functools.cache
def _spellings() -> frozenset[str]:
    # Every shipped release's canonical spellings, precomputed by tools/sglang_tables.py
    # (loading the 42 tables here took ~0.2 s and ~3 MiB of the supervisor's RSS for good).
    path = config_path(*SPELLINGS_FILE)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), None, f"cannot read the option spellings: {exc}") from exc
    if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
        raise ConfigError(str(path), None, "the option spellings are not a list of strings")
    return frozenset(data)


def other_release_has(flag: str) -> bool:
    """True when some shipped release spells one of its options `flag`."""
    return flag in _spellings()


def _table_for(pack: RulePack, running: OptionTable | None) -> OptionTable:
    version = release_to_check(pack.sglang_versions, running.sglang_version if running else None,
                               known_releases())
    if version is None:
        raise ConfigError(pack.path, "pack.sglang_versions",
                          f"{pack.sglang_versions!r} holds no SGLang release this guard has "
                          f"an option table for (pack {pack.name!r})")
    if running is not None and version == running.sglang_version:
        return running
    return load_option_table(version)
