"""`sglang-guard run`: preflight, then supervise. Wires files, facts and the loop together."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_guard.core.argv import CommandLine, find_config_path
from sglang_guard.core.facts import GpuFacts
from sglang_guard.core.guardconfig import GuardConfig
from sglang_guard.core.machine import Env
from sglang_guard.core.options import OptionTable, load_option_table
from sglang_guard.core.preflight import Decision
from sglang_guard.core.redact import redact_argv
from sglang_guard.core.rules import Matcher, RulePack, load_default_pack, parse_pack
from sglang_guard.errors import ConfigError, GuardError, InputError, Refused
from sglang_guard.shell.files import NotARegularFileError, read_text
from sglang_guard.shell.gpuprobe import resolve_gpu
from sglang_guard.shell.inputs import decide, gather, read_command_line, write_derived
from sglang_guard.shell.journal import Journal
from sglang_guard.shell.logsetup import get_logger
from sglang_guard.shell.preflightlog import log_warnings
from sglang_guard.shell.reloader import Reloader
from sglang_guard.shell.supervisor import Runtime, run_supervisor
from sglang_guard.shell.watch import Kind

LAUNCH_MODULE = ("-m", "sglang.launch_server")


def _same(cfg: GuardConfig) -> GuardConfig:
    return cfg


@dataclass(frozen=True, slots=True)
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


def load_packs(cfg: GuardConfig) -> tuple[RulePack, ...]:
    """The default pack (unless disabled) and the packs the guard config names."""
    packs = [load_default_pack()] if cfg.rules.default_pack else []
    for path in cfg.rules.packs:
        try:
            text = read_text(path)
        except FileNotFoundError:
            raise ConfigError(path, None, "rule pack not found") from None
        except NotARegularFileError as exc:
            raise ConfigError(path, None, f"{exc.strerror}: expected a rule pack (TOML)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(path, None, f"cannot read rule pack ({exc})") from None
        packs.append(parse_pack(text, path))
    return tuple(packs)


def launch_prefix(cfg: GuardConfig, python: str | None) -> list[str]:
    """`python -m sglang.launch_server`, or the guard config's own launch command."""
    if cfg.sglang.launch:
        return list(cfg.sglang.launch)
    return [python or cfg.sglang.python or sys.executable, *LAUNCH_MODULE]


def sglang_version(python: str) -> str | None:
    """The SGLang version installed for `python` (None when it cannot tell)."""
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def journal_preflight(journal: Journal | None, decision: Decision, table: OptionTable,
                      seen: set[tuple[str, str | None, str, str | None]] | None = None) -> None:
    """One `remediated` event per preflight change (other findings as `preflight.<action>`).

    `seen` remembers what was journaled already: a reload re-runs preflight on the same
    command line, and the same fix is not news.
    """
    if journal is None:
        return
    for f in decision.findings:
        key = (f.flag, f.value, f.action, f.new_value)
        if seen is not None:
            if key in seen:
                continue
            seen.add(key)
        event = "remediated" if f.action in ("drop", "rewrite") else f"preflight.{f.action}"
        record = {"event": event,
                  "trigger": "preflight", "rule": f"compat.{f.kind}", "flag": f.flag,
                  "value": f.value, "action": f.action, "new_value": f.new_value,
                  "reason": f.reason,
                  "argv_before": redact_argv(decision.argv_in, table),
                  "argv_after": redact_argv(decision.argv_out, table)}
        journal.write(record)


def run(cfg: GuardConfig, opts: RunOptions) -> int:
    """Preflight (unless disabled), then supervise SGLang; the exit status."""
    log = get_logger()
    journal: Journal | None
    try:
        journal = Journal.open(opts.state_dir)
    except ConfigError as exc:
        log.error("journal.unavailable", error=str(exc))
        journal = None
    derived_dir = str(Path(opts.state_dir) / "derived")
    facts: dict[str, object] = {"arch": "unknown", "gpu": None}
    journaled: set[tuple[str, str | None, str, str | None]] = set()

    def prepare(cfg: GuardConfig, argv: tuple[str, ...]) -> CommandLine:
        """The command line to run: preflight's, with its derived YAML written."""
        if not opts.preflight:
            return read_command_line(argv)
        inputs = gather(argv, cfg.gpu_sm, isolate=True)
        decision = decide(inputs, cfg.policy, opts.state_dir)
        journal_preflight(journal, decision, inputs.options, journaled)
        log_warnings(decision)  # what `check` shows (hub id, NVML, "SGLang will reject ...")
        for finding in decision.findings:
            log.warning("preflight.finding", flag=finding.flag, value=finding.value,
                        action=finding.action, reason=finding.reason)
        if decision.verdict == "refused":
            refusals = [f for f in decision.findings if f.action == "refuse"]
            raise Refused("policy refused the command line: " + "; ".join(
                f"{f.flag} {f.value}: {f.reason}" for f in refusals))
        write_derived(decision)
        facts["arch"], facts["gpu"] = inputs.model.attention_arch, inputs.gpu
        return read_command_line(decision.argv_out, inputs.options)

    cl = prepare(cfg, opts.argv)
    gpu = facts["gpu"] if isinstance(facts["gpu"], GpuFacts) else _gpu_quietly(cfg.gpu_sm)
    prefix = launch_prefix(cfg, opts.python)
    env = Env(options=load_option_table(), matcher=Matcher(load_packs(cfg)), restart=cfg.restart,
              health=cfg.health, arch=str(facts["arch"]), sm=gpu.sm,
              sglang_version=sglang_version(prefix[0]) if not cfg.sglang.launch else None,
              derived_dir=derived_dir)
    reloader = Reloader(
        config_path=cfg.path, overrides=opts.overrides,
        argv_from_cli=None if opts.argv_from_config else opts.argv,
        sglang_args=lambda c, argv: argv if argv is not None else config_args(c),
        preflight=prepare, load_matcher=lambda c: Matcher(load_packs(c)), base=cl, cfg=cfg,
        facts=lambda: (str(facts["arch"]),
                       facts["gpu"].sm if isinstance(facts["gpu"], GpuFacts) else env.sm))
    rt = Runtime(launch=prefix, state_dir=opts.state_dir, env=env,
                 reload=lambda kind, path: reloader.reload(kind, path, rt.env),
                 watch=watched_files(cfg, opts.argv))
    return run_supervisor(rt, cl, journal)


def config_args(cfg: GuardConfig) -> tuple[str, ...]:
    """The SGLang arguments the guard config gives (`[sglang] config` and `args`)."""
    args = cfg.sglang_argv()
    if not args:
        raise InputError("the guard config gives no SGLang arguments ([sglang] args / config)")
    return args


def watched_files(cfg: GuardConfig, argv: tuple[str, ...]) -> dict[str, Kind]:
    """The guard config, the SGLang YAML that `--config` names, and the extra rule packs."""
    files: dict[str, Kind] = {}
    if cfg.path:
        files[cfg.path] = "guard_config"
    with contextlib.suppress(GuardError):
        yaml_path = find_config_path(argv)
        if yaml_path:
            files[yaml_path] = "sglang_yaml"
    for pack in cfg.rules.packs:
        files[pack] = "rule_pack"
    return files


def _gpu_quietly(gpu_sm: str) -> GpuFacts:
    try:
        return resolve_gpu(gpu_sm)
    except GuardError:
        return GpuFacts(sm=None)
