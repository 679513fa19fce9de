"""The guard's own config file (TOML): parsed and validated once, into frozen values.

Every error names the file, the key and what was expected. Unknown keys are errors too: a
typo in a policy key must not silently fall back to the default.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, cast, get_args

from sglang_guard.core.compat import BACKEND_FLAGS
from sglang_guard.core.limits import toml_loads
from sglang_guard.errors import ConfigError, InputError

PolicyMode = Literal["drop", "rewrite", "fail", "warn"]
POLICY_MODES: tuple[str, ...] = get_args(PolicyMode)
LogFormat = Literal["auto", "json", "console"]


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """What to do with a flag that does not fit: per-flag overrides over a default."""

    default: PolicyMode = "drop"
    flags: Mapping[str, PolicyMode] = field(default_factory=dict)
    # flag -> {bad value or "*" -> replacement}: the explicit map `rewrite` uses first.
    rewrite: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def mode(self, flag: str) -> PolicyMode:
        """The policy for `flag` (its override, else the default)."""
        return self.flags.get(flag, self.default)


@dataclass(frozen=True, slots=True)
class SglangSection:
    """The SGLang command the guard runs when none is given on its command line."""

    args: tuple[str, ...] = ()
    config: str | None = None  # an SGLang YAML: becomes `--config PATH`
    # e.g. ("sglang", "serve"); default: <python> -m sglang.launch_server
    launch: tuple[str, ...] = ()
    python: str | None = None


@dataclass(frozen=True, slots=True)
class RestartSection:
    """Crash-loop limits and backoff."""

    max_failures: int = 5  # give up after this many failures ...
    window_s: float = 600.0  # ... within this many seconds
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_factor: float = 2.0
    stable_after_s: float = 300.0  # a run this long resets the backoff
    stop_grace_s: float = 20.0  # SIGTERM -> SIGKILL
    ready_timeout_s: float = 3600.0  # no readiness within this: restart


@dataclass(frozen=True, slots=True)
class HealthSection:
    """Readiness and liveness probing of SGLang's HTTP server."""

    enabled: bool = True
    host: str | None = None  # default: SGLang's --host (0.0.0.0 probed as 127.0.0.1)
    timeout_s: float = 30.0  # SGLang's /health_generate itself may take up to 20 s
    liveness_interval_s: float = 30.0
    liveness_failures: int = 3  # this many failed /health_generate in a row restart SGLang


@dataclass(frozen=True, slots=True)
class RulesSection:
    """Which rule packs the supervisor matches log lines against."""

    default_pack: bool = True
    packs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """The whole guard config; every section has defaults, so an empty file is valid."""

    path: str | None = None
    sglang: SglangSection = field(default_factory=SglangSection)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    restart: RestartSection = field(default_factory=RestartSection)
    health: HealthSection = field(default_factory=HealthSection)
    rules: RulesSection = field(default_factory=RulesSection)
    state_dir: str | None = None
    gpu_sm: str = "auto"
    log_format: LogFormat = "auto"

    def sglang_argv(self) -> tuple[str, ...]:
        """The SGLang arguments this config gives: `--config <[sglang] config>`, then `args`."""
        head = ("--config", self.sglang.config) if self.sglang.config else ()
        return (*head, *self.sglang.args)


def with_overrides(cfg: GuardConfig, policy: str | None, gpu_sm: str | None,
                   *, policy_source: str = "--policy") -> GuardConfig:
    """--policy / --gpu-sm (or their SGLANG_GUARD_* twins) over what the config file says."""
    if policy:
        if policy not in POLICY_MODES:
            raise InputError(f"{policy_source}={policy!r}: expected one of "
                             f"{', '.join(POLICY_MODES)}")
        cfg = replace(cfg, policy=replace(cfg.policy, default=cast("PolicyMode", policy)))
    if gpu_sm:
        cfg = replace(cfg, gpu_sm=gpu_sm)
    return cfg


def parse_guard_config(text: str, path: str) -> GuardConfig:
    """Parse and validate the TOML text of a guard config."""
    try:
        data = toml_loads(text)  # tomllib.loads with size/depth limits
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, None, f"not valid TOML: {exc}") from exc
    allowed = {"sglang", "policy", "restart", "health", "rules", "state", "gpu", "log"}
    _no_unknown(path, "", data, allowed)
    return GuardConfig(
        path=path,
        sglang=_section(path, "sglang", data, SglangSection),
        policy=_policy(path, data.get("policy", {})),
        restart=_section(path, "restart", data, RestartSection),
        health=_section(path, "health", data, HealthSection),
        rules=_section(path, "rules", data, RulesSection),
        state_dir=_typed(path, "state.dir", _leaf(path, "state", data, "dir"), (str, type(None))),
        gpu_sm=_gpu_sm(path, _leaf(path, "gpu", data, "sm", "auto")),
        log_format=_choice(path, "log.format", _leaf(path, "log", data, "format", "auto"),
                           ("auto", "json", "console")),
    )


def _leaf(path: str, name: str, data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """The one key a one-key section such as [gpu] holds (others are unknown keys)."""
    table = _table(path, name, data.get(name, {}))
    _no_unknown(path, f"{name}.", table, {key})
    return table.get(key, default)


# What `--gpu-sm` accepts (shell/gpuprobe.parse_gpu_sm does the range check).
_GPU_SM = re.compile(r"^(auto|none|(sm)?\d{2,3}|\d+\.\d)$", re.IGNORECASE)


def _gpu_sm(path: str, value: Any) -> str:
    text = str(_typed(path, "gpu.sm", value, (str, int)))
    if not _GPU_SM.match(text.strip()):
        raise ConfigError(path, "gpu.sm", f"expected auto, none or an SM such as 90, got {text!r}")
    return text


def _table(path: str, key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(path, key, f"expected a table, got {type(value).__name__}")
    return value


def _no_unknown(path: str, prefix: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    for key in data:
        if key not in allowed:
            raise ConfigError(path, f"{prefix}{key}",
                              f"unknown key (expected one of: {', '.join(sorted(allowed))})")


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "bool": (bool,), "str | None": (str, type(None)),
    "tuple[str, ...]": (list,), "str": (str,),
}


def _section(path: str, name: str, data: Mapping[str, Any], cls: type[Any]) -> Any:
    raw = _table(path, name, data.get(name, {}))
    spec = {f.name: f for f in fields(cls)}
    _no_unknown(path, f"{name}.", raw, set(spec))
    values: dict[str, Any] = {}
    for key, raw_value in raw.items():
        value: Any = raw_value
        kind = str(spec[key].type)
        expected = _TYPES.get(kind, (object,))
        if isinstance(value, bool) and bool not in expected:
            expected = ()  # TOML true is not a number
        if not isinstance(value, expected):
            raise ConfigError(path, f"{name}.{key}",
                              f"expected {kind}, got {type(value).__name__} {value!r}")
        if kind == "tuple[str, ...]":
            if not all(isinstance(v, str) for v in raw_value):
                raise ConfigError(path, f"{name}.{key}", "expected a list of strings")
            value = tuple(raw_value)
        # TOML has nan and inf; neither is a usable count, delay or timeout.
        if kind in ("int", "float") and (value < 0 or not math.isfinite(value)):
            raise ConfigError(path, f"{name}.{key}", f"must be a finite number >= 0, got {value}")
        values[key] = float(value) if kind == "float" else value
    return cls(**values)


def _typed(path: str, key: str, value: Any, types: tuple[type, ...]) -> Any:
    if isinstance(value, bool) or not isinstance(value, types):
        names = " or ".join(t.__name__ for t in types if t is not type(None))
        raise ConfigError(path, key, f"expected {names}, got {type(value).__name__} {value!r}")
    return value


def _choice(path: str, key: str, value: Any, choices: tuple[str, ...]) -> Any:
    if value not in choices:
        raise ConfigError(path, key, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def _policy(path: str, raw: Any) -> PolicyConfig:
    if not isinstance(raw, dict):
        raise ConfigError(path, "policy", f"expected a table, got {type(raw).__name__}")
    _no_unknown(path, "policy.", raw, {"default", "flags", "rewrite"})
    default = _choice(path, "policy.default", raw.get("default", "drop"), POLICY_MODES)
    flags = _table(path, "policy.flags", raw.get("flags", {}))
    for flag, mode in flags.items():
        _flag_name(path, f"policy.flags.{flag}", flag)
        _choice(path, f"policy.flags.{flag}", mode, POLICY_MODES)
    rewrite: dict[str, dict[str, str]] = {}
    for flag, target in _table(path, "policy.rewrite", raw.get("rewrite", {})).items():
        _flag_name(path, f"policy.rewrite.{flag}", flag)
        if isinstance(target, str):
            rewrite[flag] = {"*": target}
        elif isinstance(target, dict) and all(isinstance(v, str) for v in target.values()):
            rewrite[flag] = dict(target)
        else:
            raise ConfigError(path, f"policy.rewrite.{flag}",
                              "expected a backend name or a table of bad value -> backend")
    return PolicyConfig(default, dict(flags), rewrite)


def _flag_name(path: str, key: str, flag: str) -> None:
    if not flag.startswith("--"):
        raise ConfigError(path, key, f"flags are written as SGLang spells them, e.g. --{flag}")
    # Preflight applies the policy to these flags only; any other name is a typo.
    if flag not in BACKEND_FLAGS:
        raise ConfigError(path, key, f"not a flag the policy applies to "
                                     f"(one of: {', '.join(BACKEND_FLAGS)})")
