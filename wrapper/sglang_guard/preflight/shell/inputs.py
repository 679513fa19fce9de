"""Gather what preflight decides on: the parsed command line (and its YAML), model, GPU facts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sglang_guard.common.record import record
from sglang_guard.common.shell.files import read_user_text
from sglang_guard.config.guardconfig import PolicyConfig
from sglang_guard.config.limits import yaml_safe_load
from sglang_guard.config.shell.tablecache import decoded_toml
from sglang_guard.errors import GuardError, InputError
from sglang_guard.preflight.compat import CompatTable
from sglang_guard.preflight.compat_table import confirmed_only, load_raw_table
from sglang_guard.preflight.facts import GpuFacts, ModelFacts, with_warning
from sglang_guard.preflight.preflight import Decision, preflight
from sglang_guard.preflight.shell.gpuprobe import resolve_gpu
from sglang_guard.preflight.shell.modelprobe import resolve_model
from sglang_guard.preflight.shell.whichrelease import Release
from sglang_guard.preflight.sizes import confirm as confirm_sizes
from sglang_guard.sglang.argv import (
    CommandLine,
    find_config_path,
    parse_command_line,
    remote_code_trust,
)
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.releases import load_option_table

# The option lists that name attention backends (their union is what a release accepts).
BACKEND_CHOICES = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


@record
class Inputs:
    """Everything preflight needs, read from the world once."""

    cl: CommandLine
    options: OptionTable
    compat: CompatTable
    model: ModelFacts
    draft: ModelFacts | None
    gpu: GpuFacts
    release: Release
    notes: tuple[str, ...] = ()  # what preflight should say about the release
    unconfirmed: frozenset[str] = frozenset()  # size checks that only warn (sizes.confirm)


def load_yaml(path: str) -> dict[str, Any]:
    """Read an SGLang `--config` YAML the way SGLang does (safe_load, a mapping at the root)."""
    text = read_user_text(path, "an SGLang YAML file",
                          lambda problem: InputError(f"--config {path}: {problem}"))
    import yaml  # noqa: PLC0415 - only command lines with --config need it (1 MiB resident)

    try:
        data = yaml_safe_load(text)  # size, depth and alias limits (config/limits.py)
    except yaml.YAMLError as exc:
        first = str(exc).replace("\n", " ")
        raise InputError(f"--config {path}: not valid YAML ({first})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"--config {path}: the YAML must be a mapping of flag names to values")
    return data


def read_command_line(argv: Sequence[str], options: OptionTable | None = None) -> CommandLine:
    """Parse `argv`, loading the YAML that `--config` names."""
    options = options or load_option_table()
    config = find_config_path(tuple(argv))
    return parse_command_line(tuple(argv), options, load_yaml(config) if config else None)


# An unshipped release's confirmed view, once per process: its whole source is searched for
# it, and a reload prepares the same release again.
_CONFIRMED: dict[tuple[str, str, str], tuple[CompatTable, tuple[str, ...], frozenset[str]]] = {}


def compat_for(release: Release) -> tuple[CompatTable, tuple[str, ...]]:
    """The backend table as it holds for `release`, and a line about it when it has no table."""
    compat, notes, _ = checks_for(release)
    return compat, notes


def checks_for(release: Release) -> tuple[CompatTable, tuple[str, ...], frozenset[str]]:
    """The backend table as it holds for `release`; for a release newer than the tables,
    one start line saying which checks its own source does not confirm (those only warn),
    and the size checks among them (by their source, preflight/sizes.py)."""
    tables = release.tables
    names = tuple(dict.fromkeys(
        name for dest in BACKEND_CHOICES for name in tables.choices.get(dest, ())))
    compat = load_raw_table(decoded_toml).for_release(tables.release, names or None)
    if tables.origin == "shipped":
        return compat, (), frozenset()
    key = (tables.requested, tables.release, str(release.site))
    if key not in _CONFIRMED:
        source = release.source_text()
        confirmed, ok, total = confirmed_only(compat, source)
        sized, unsized = confirm_sizes(source)
        missing = ", ".join(f"{c.kind} ({c.source.split('/')[-1]})" for c in unsized)
        _CONFIRMED[key] = confirmed, (
            f"SGLang {tables.requested}: not in the tables; {ok} of {total} backend checks "
            f"of SGLang {tables.release} and {len(sized)} of {len(sized) + len(unsized)} "
            "size checks confirmed in its source (the rest warn)"
            + (f"; not confirmed: {missing}" if missing else ""),
        ), frozenset(c.source for c in unsized)
    return _CONFIRMED[key]


def gather(argv: Sequence[str], gpu_sm: str, release: Release, *,
           isolate: bool = False) -> Inputs:
    """Read the command line, resolve the model (and draft) and the GPU."""
    options = release.tables.options
    cl = read_command_line(argv, options)
    model_path = cl.value("model_path")
    if not model_path:
        raise InputError("the SGLang command line has no --model-path")
    trust, distrust = remote_code_trust(cl)
    overrides = cl.value("json_model_override_args")
    rel = release.tables.release
    model = resolve_model(model_path, revision=cl.value("revision"),
                          trust_remote_code=trust, override_args=overrides, isolate=isolate,
                          sglang_release=rel)
    draft = None
    draft_path = cl.value("speculative_draft_model_path")
    if draft_path or cl.value("speculative_algorithm"):
        draft = resolve_model(
            draft_path or model_path,
            revision=cl.value("speculative_draft_model_revision") or cl.value("revision"),
            trust_remote_code=trust, override_args=overrides, is_draft=True,
            isolate=isolate, sglang_release=rel,
        )
    model = with_warning(model, distrust)
    compat, notes, unconfirmed = checks_for(release)
    return Inputs(cl, options, compat, model, draft, resolve_gpu(gpu_sm), release, notes,
                  unconfirmed)


def default_state_dir() -> str:
    """`$SGLANG_GUARD_STATE_DIR`, else $XDG_STATE_HOME/sglang-guard (or /var/lib for root)."""
    env = os.environ.get("SGLANG_GUARD_STATE_DIR")
    if env:
        return env
    if os.geteuid() == 0 and not os.environ.get("XDG_STATE_HOME"):
        return "/var/lib/sglang-guard"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "sglang-guard")


def derived_dir(state_dir: str) -> str:
    """Where derived SGLang YAMLs are named (and written, at spawn)."""
    return str(Path(state_dir) / "derived")


def decide(inputs: Inputs, policy: PolicyConfig, state_dir: str) -> Decision:
    """Run preflight; derived YAMLs are named under `<state_dir>/derived`."""
    allow = os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() in (
        "1", "true", "yes", "on")  # SGLang's own switch for a longer --context-length
    decision = preflight(inputs.cl, inputs.options, inputs.compat, model=inputs.model,
                         draft=inputs.draft, gpu=inputs.gpu, policy=policy,
                         derived_dir=derived_dir(state_dir), allow_longer_context=allow,
                         unconfirmed=inputs.unconfirmed)
    if inputs.notes:
        decision = replace(decision, warnings=(*inputs.notes, *decision.warnings))
    return decision


@record
class Prepared:
    """One launch's command line, and the facts and decision it was made from."""

    cl: CommandLine  # what to launch; a derived YAML is in cl.yaml_data, written at spawn
    options: OptionTable
    gpu: GpuFacts
    release: Release
    user_config: str | None  # the user's own `--config` YAML (watched), not a derived one
    inputs: Inputs | None = None  # None: preflight was skipped
    decision: Decision | None = None

    @property
    def arch(self) -> str:
        """The model's attention arch as preflight saw it ("unknown" without preflight)."""
        return self.inputs.model.attention_arch if self.inputs is not None else "unknown"

    @property
    def sm(self) -> int | None:
        """The GPU's SM (None when unknown)."""
        return self.gpu.sm


def prepare(gpu_sm: str, policy: PolicyConfig, argv: Sequence[str], state_dir: str,
            release: Release, *, preflight: bool = True, isolate: bool = False) -> Prepared:
    """Read the world once and decide: the command line to launch, with what it rests on."""
    if not preflight:
        cl = read_command_line(argv, release.tables.options)
        return Prepared(cl, release.tables.options, gpu_quietly(gpu_sm), release, cl.config_path)
    inputs = gather(argv, gpu_sm, release, isolate=isolate)
    decision = decide(inputs, policy, state_dir)
    # Built in memory: argv_out names the derived YAML, whose data preflight already holds.
    yaml_data = decision.derived_yaml if decision.derived_yaml is not None else inputs.cl.yaml_data
    cl = parse_command_line(decision.argv_out, inputs.options, yaml_data)
    return Prepared(cl, inputs.options, inputs.gpu, release, inputs.cl.config_path, inputs,
                    decision)


def gpu_quietly(gpu_sm: str) -> GpuFacts:
    """The GPU facts, or unknown ones when the probe fails (preflight skipped: nothing to tell)."""
    try:
        return resolve_gpu(gpu_sm)
    except GuardError:
        return GpuFacts(sm=None)
