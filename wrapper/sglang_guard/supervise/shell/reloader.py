"""Reloading the guard config, the SGLang YAML and the rule packs while SGLang runs.

Every change is validated first; an invalid or deleted file is reported and the last good
version keeps serving. Rule packs and policy apply to the next log line without a restart.
Only a change of the *effective* SGLang command line (after preflight) restarts SGLang, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from sglang_guard.common.outcomes import ReloadApplied, ReloadRejected
from sglang_guard.common.record import record
from sglang_guard.common.shell.heap import trim_heap
from sglang_guard.config.guardconfig import GuardConfig
from sglang_guard.config.shell.configfile import read_guard_config
from sglang_guard.errors import GuardError, InputError
from sglang_guard.rules.rules import Matcher
from sglang_guard.rules.shell.packs import load_packs
from sglang_guard.sglang.argv import CommandLine
from sglang_guard.supervise.machine import Env, rehearse

if TYPE_CHECKING:  # the loop imports this module; preflight's probes load only in `run`
    from sglang_guard.preflight.shell.inputs import Prepared


@record
class ReloadOutcome:
    """What a reload decided: a new Env (or None: keep), a new command line (None: no restart)."""

    env: Env | None
    cl: CommandLine | None
    error: str | None
    record: ReloadApplied | ReloadRejected


def effective_view(cl: CommandLine) -> dict[str, str | None]:
    """What SGLang will run with: every effective value, wherever it came from.

    `--config`'s own path is left out: a derived YAML gets a new name whenever its content
    changes, and its content is already part of the effective values.
    """
    view = cl.effective()
    view.pop("--config", None)
    return view


def config_args(cfg: GuardConfig) -> tuple[str, ...]:
    """The SGLang arguments the guard config gives (`[sglang] config` and `args`)."""
    args = cfg.sglang_argv()
    if not args:
        raise InputError("the guard config gives no SGLang arguments ([sglang] args / config)")
    return args


class Prepare(Protocol):
    """Preflight for one launch (`runner.Preflight`): argv under a config -> Prepared."""

    def __call__(self, cfg: GuardConfig, argv: tuple[str, ...]) -> Prepared: ...


@dataclass
class Reloader:
    """Re-reads what the guard was started from and says what must change."""

    cfg: GuardConfig
    overrides: Callable[[GuardConfig], GuardConfig]  # --policy / --gpu-sm from the command line
    prepare: Prepare
    base: CommandLine  # the command line preflight produced last
    argv_from_cli: tuple[str, ...] | None  # None: the SGLang args come from the guard config

    def reload(self, kind: str, path: str | None, env: Env) -> ReloadOutcome:
        """Validate and apply a change of `kind` ("guard_config", "sglang_yaml", "rule_pack")."""
        try:
            cfg = self.overrides(read_guard_config(self.cfg.path)) if self.cfg.path \
                else self.cfg
            new_env = replace(env, matcher=Matcher(load_packs(cfg, env.options)),
                              restart=cfg.restart, health=cfg.health, start=cfg.start)
            new_env.matcher.prepare_scan()  # here, not in a reader thread on the next chunk
            rehearse(new_env, self.base)  # nor the new rules' first use on a fatal line
            trim_heap()
        except GuardError as exc:
            return self._rejected(kind, path, str(exc), env_applied=False)
        self.cfg = cfg
        if kind == "rule_pack":  # a pack cannot change the command line: nothing to re-derive
            return ReloadOutcome(new_env, None, None, ReloadApplied(
                kind=kind, path=path, restart=False,
                why="rule packs apply to new log lines; SGLang keeps running"))
        try:
            prepared = self.prepare(cfg, self.argv_from_cli or config_args(cfg))
        except GuardError as exc:
            outcome = self._rejected(kind, path, str(exc), env_applied=True)
            return ReloadOutcome(new_env, None, outcome.error, outcome.record)
        # A YAML edit may name another model: the rules' conditions read its arch and SM.
        new_env = replace(new_env, arch=prepared.arch, sm=prepared.sm if prepared.decision
                          else new_env.sm)
        cl = prepared.cl
        before, after = effective_view(self.base), effective_view(cl)
        if before != after:
            diff = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
            self.base = cl
            return ReloadOutcome(new_env, cl, None, ReloadApplied(
                kind=kind, path=path, restart=True, changed=diff,
                why="the effective SGLang command line changed"))
        return ReloadOutcome(new_env, None, None, ReloadApplied(
            kind=kind, path=path, restart=False,
            why="the effective SGLang command line is unchanged; rule packs and policy "
                "apply to new log lines"))

    @staticmethod
    def _rejected(kind: str, path: str | None, error: str, *, env_applied: bool
                  ) -> ReloadOutcome:
        keeps = ("the SGLang command line keeps its last good version (rule packs and policy "
                 "were reloaded)" if env_applied
                 else "the last good configuration keeps serving")
        return ReloadOutcome(None, None, error,
                             ReloadRejected(kind=kind, path=path, error=error, keeps=keeps))
