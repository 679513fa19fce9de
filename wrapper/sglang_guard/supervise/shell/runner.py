"""`sglang-guard run`: preflight, then supervise. Straight-line wiring of files, facts and loop."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sglang_guard.common.outcomes import (
    GroupStarted,
    GuardExit,
    LearnedReplayed,
    PreflightFinding,
    StatusListening,
)
from sglang_guard.common.record import record
from sglang_guard.common.shell.heap import trim_heap
from sglang_guard.common.shell.logsetup import get_logger
from sglang_guard.config.guardconfig import GuardConfig
from sglang_guard.errors import ConfigError, GuardError, InputError, Refused
from sglang_guard.group.group import group_spec
from sglang_guard.preflight.preflight import Decision
from sglang_guard.preflight.shell.inputs import Prepared, derived_dir, prepare
from sglang_guard.preflight.shell.preflightlog import log_warnings
from sglang_guard.preflight.shell.whichrelease import Release, resolve_release
from sglang_guard.rules import blockscan
from sglang_guard.rules.rules import Matcher, RulePack
from sglang_guard.rules.shell.packs import load_packs
from sglang_guard.rules.shell.scancache import build_elsewhere, default_store
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.redact import redact_argv
from sglang_guard.supervise.machine import Env, rehearse
from sglang_guard.supervise.shell.journal import Journal
from sglang_guard.supervise.shell.observer import NO_OBSERVER, Listener
from sglang_guard.supervise.shell.reloader import Prepare, Reloader
from sglang_guard.supervise.shell.supervisor import Runtime, run_supervisor
from sglang_guard.supervise.shell.watch import Kind

if TYPE_CHECKING:
    from sglang_guard.fleet.shell.fleet import Fleet

LAUNCH_MODULE = ("-m", "sglang.launch_server")
Seen = set[tuple[str, str | None, str, str | None]]


def _same(cfg: GuardConfig) -> GuardConfig:
    return cfg


@record
class RunOptions:
    """What the `run` command line adds to the guard config."""

    argv: tuple[str, ...]
    python: str | None
    state_dir: str
    preflight: bool
    # The SGLang args came from the guard config (so an edit of it may change them).
    argv_from_config: bool = False
    # Re-applies --policy / --gpu-sm to a reloaded guard config.
    overrides: Callable[[GuardConfig], GuardConfig] = _same
    observer: Listener = NO_OBSERVER  # the status port's hooks (status/shell/status.py)


def launch_prefix(cfg: GuardConfig, python: str | None) -> list[str]:
    """`python -m sglang.launch_server`, or the guard config's own launch command."""
    if cfg.sglang.launch:
        return list(cfg.sglang.launch)
    return [python or cfg.sglang.python or sys.executable, *LAUNCH_MODULE]


def journal_preflight(journal: Journal | None, decision: Decision, table: OptionTable,
                      seen: Seen | None = None, observer: Listener = NO_OBSERVER) -> None:
    """One `remediated` event per preflight change (other findings as `preflight.<action>`).

    `seen` remembers what was journaled already: a reload re-runs preflight on the same
    command line, and the same fix is not news. The observer sees each record too.
    """
    for f in decision.findings:
        key = (f.flag, f.value, f.action, f.new_value)
        if seen is not None:
            if key in seen:
                continue
            seen.add(key)
        record = PreflightFinding(rule=f"compat.{f.kind}", flag=f.flag, value=f.value,
                                  action=f.action, new_value=f.new_value, reason=f.reason,
                                  argv_before=redact_argv(decision.argv_in, table),
                                  argv_after=redact_argv(decision.argv_out, table))
        observer.record(record)
        if journal is not None:
            journal.write(record)


@dataclass
class Preflight:
    """Prepare a launch the way `run` does: journal the findings once, refuse per policy."""

    state_dir: str
    enabled: bool
    journal: Journal | None
    release: Release
    seen: Seen = field(default_factory=set)
    observer: Listener = NO_OBSERVER

    def __call__(self, cfg: GuardConfig, argv: tuple[str, ...]) -> Prepared:
        """The prepared launch for `argv` under `cfg`; Refused when the policy says so."""
        prepared = prepare(cfg.gpu_sm, cfg.policy, argv, self.state_dir, self.release,
                           preflight=self.enabled, isolate=True)
        decision = prepared.decision
        if decision is None:
            return prepared
        journal_preflight(self.journal, decision, prepared.options, self.seen, self.observer)
        log_warnings(decision)  # what `check` shows (hub id, NVML, "SGLang will reject ...")
        log = get_logger()
        for finding in decision.findings:
            log.warning("preflight.finding", flag=finding.flag, value=finding.value,
                        action=finding.action, reason=finding.reason)
        if decision.verdict == "rejected":  # SGLang's parser would exit 2: never launched
            rejected = [f for f in decision.findings if f.kind == "parser"]
            raise InputError(
                f"SGLang {prepared.release.version}'s parser rejects the command line, not "
                "launched: " + "; ".join(f"{f.flag}: {f.reason}" for f in rejected))
        if decision.verdict == "refused":
            refusals = [f for f in decision.findings if f.action == "refuse"]
            raise Refused("policy refused the command line: " + "; ".join(
                f"{f.flag} {f.value}: {f.reason}" for f in refusals))
        return prepared


def open_journal(state_dir: str) -> Journal | None:
    """The journal, or None (said once) when the state dir cannot hold one."""
    try:
        return Journal.open(state_dir)
    except ConfigError as exc:
        get_logger().error("journal.unavailable", error=str(exc))
        return None


def run(cfg: GuardConfig, opts: RunOptions) -> int:
    """Preflight (unless disabled), then supervise SGLang; the exit status."""
    journal = open_journal(opts.state_dir)
    listening = getattr(opts.observer, "address", None)  # the status port, when it is up
    if journal is not None and listening is not None:
        journal.write(StatusListening(host=listening[0], port=listening[1]))
    prefix = launch_prefix(cfg, opts.python)
    release = resolve_release(version=cfg.sglang.version, version_source="[sglang] version",
                              python=cfg.sglang.python if cfg.sglang.launch else prefix[0],
                              unknown_why="[sglang] launch names no interpreter to read; "
                                          "set [sglang] python or version",
                              runs_sglang=not cfg.sglang.launch)
    preflight = Preflight(opts.state_dir, opts.preflight, journal, release,
                          observer=opts.observer)
    try:
        first = preflight(cfg, opts.argv)
    except GuardError as exc:  # refused or rejected before any launch: said in the journal
        if journal is not None:
            journal.write(GuardExit(code=exc.exit_code, reason=str(exc)))
        raise
    packs = load_packs(cfg, first.options)
    fleet, first, observer, prepare = _with_fleet(cfg, opts, first, packs, preflight)
    env = Env(options=first.options, matcher=Matcher(packs),
              restart=cfg.restart, health=cfg.health, arch=first.arch, sm=first.sm,
              sglang_version=release.version,
              derived_dir=derived_dir(opts.state_dir), start=cfg.start)
    reloader = Reloader(cfg=cfg, overrides=opts.overrides, prepare=prepare, base=first.cl,
                        argv_from_cli=None if opts.argv_from_config else opts.argv)
    rt = Runtime(launch=prefix, state_dir=opts.state_dir, env=env, reload=reloader.reload,
                 watch=watched_files(cfg, first), observer=observer)
    get_logger().info("sglang.release", version=release.version, source=release.source,
                      table=release.tables.release, origin=release.tables.origin)
    store = default_store()  # load the compiled scan; a miss is compiled in a child process
    blockscan.use_store(store, build=build_elsewhere(store))
    engine, why = env.matcher.prepare_scan()
    if why is not None:  # the log pass-through runs at RE2's speed for these patterns
        get_logger().warning("scan.engine", engine=engine, why=why)
    rehearse(env, first.cl)  # the first fatal line need not pay the line path's first use
    trim_heap()
    cl = first.cl
    spec = group_spec(cl, os.environ, cfg.group.port)
    if spec is not None:  # a multi-node group (docs/multinode.md)
        from sglang_guard.group.shell import group  # noqa: PLC0415 - single-node guards skip it

        if journal is not None:
            journal.write(GroupStarted(rank=spec.rank, nnodes=spec.nnodes, leader=spec.leader,
                                       port=spec.port))
        try:
            rt.group, cl, rt.env, replayed = group.open_group(
                spec, cfg.group, cl, first.gpu, env, state_dir=opts.state_dir,
                policy=cfg.policy, allow_set=cfg.rules.allow_set,
                record=journal.write if journal is not None else None)
        except GuardError as exc:  # refused by the leader, or no leader: journaled, then raised
            if journal is not None:
                journal.write(GuardExit(code=exc.exit_code, reason=str(exc)))
            raise
        if replayed is not None and journal is not None:
            journal.write(LearnedReplayed(path=str(group.Learned.NAME),
                                          argv_before=redact_argv(first.cl.argv, env.options),
                                          argv_after=redact_argv(replayed.argv, env.options)))
        if not spec.leads:
            rt.reload = group.worker_reload(rt.reload)
    try:
        return run_supervisor(rt, cl, journal)
    finally:
        if fleet is not None:
            fleet.close(cfg.learn.timeout_s)


def _with_fleet(cfg: GuardConfig, opts: RunOptions, first: Prepared, packs: Sequence[RulePack],
                preflight: Preflight) -> tuple[Fleet | None, Prepared, Listener, Prepare]:
    """Fleet memory (`[learn]`, fleet/shell/fleet.py) for a single-node guard: the first launch
    with a proven entry applied, the observer that learns from the journal, and preflight
    for reloads that keeps the fleet fix."""
    if not cfg.learn.enabled or group_spec(first.cl, os.environ, cfg.group.port) is not None:
        return None, first, opts.observer, preflight
    from sglang_guard.fleet.shell import fleet as fleetwire  # noqa: PLC0415 - only with [learn]

    fleet = fleetwire.open_fleet(cfg, opts.state_dir, first, packs)
    if fleet is None:
        return None, first, opts.observer, preflight
    own = fleetwire.own_journal(opts.state_dir)
    sinks = [opts.observer.record, *([own.write] if own is not None else [])]
    first = replace(first, cl=fleet.before_launch(first.cl, sinks))

    def prepare(cfg: GuardConfig, argv: tuple[str, ...]) -> Prepared:
        return fleet.reapply(preflight(cfg, argv))

    return fleet, first, fleetwire.FleetObserver(opts.observer, fleet), prepare


def watched_files(cfg: GuardConfig, prepared: Prepared) -> dict[str, Kind]:
    """The guard config, the SGLang YAML that `--config` names, and the extra rule packs."""
    files: dict[str, Kind] = {}
    if cfg.path:
        files[cfg.path] = "guard_config"
    if prepared.user_config:
        files[prepared.user_config] = "sglang_yaml"
    for pack in cfg.rules.packs:
        files[pack] = "rule_pack"
    return files

