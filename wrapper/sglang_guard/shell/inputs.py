"""Gather what preflight decides on: the parsed command line (and its YAML), model, GPU facts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_guard.core.argv import (
    CommandLine,
    find_config_path,
    parse_command_line,
    remote_code_trust,
)
from sglang_guard.core.compat import CompatTable, load_default_table
from sglang_guard.core.edits import dump_yaml
from sglang_guard.core.facts import GpuFacts, ModelFacts, with_warning
from sglang_guard.core.guardconfig import PolicyConfig
from sglang_guard.core.limits import yaml_safe_load
from sglang_guard.core.options import OptionTable, load_option_table
from sglang_guard.core.preflight import Decision, preflight
from sglang_guard.errors import InputError
from sglang_guard.shell.files import NotARegularFileError, read_text, write_private
from sglang_guard.shell.gpuprobe import resolve_gpu
from sglang_guard.shell.modelprobe import resolve_model


@dataclass(frozen=True, slots=True)
class Inputs:
    """Everything preflight needs, read from the world once."""

    cl: CommandLine
    options: OptionTable
    compat: CompatTable
    model: ModelFacts
    draft: ModelFacts | None
    gpu: GpuFacts


def load_yaml(path: str) -> dict[str, Any]:
    """Read an SGLang `--config` YAML the way SGLang does (safe_load, a mapping at the root)."""
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise InputError(f"--config {path}: file not found") from None
    except NotARegularFileError as exc:
        raise InputError(f"--config {path}: {exc.strerror}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--config {path}: cannot read it ({exc})") from None
    import yaml  # noqa: PLC0415 - only command lines with --config need it (1 MiB resident)

    try:
        data = yaml_safe_load(text)  # size, depth and alias limits (core/limits.py)
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


def gather(argv: Sequence[str], gpu_sm: str, *, isolate: bool = False) -> Inputs:
    """Read the command line, resolve the model (and draft) and the GPU."""
    options = load_option_table()
    cl = read_command_line(argv, options)
    model_path = cl.value("model_path")
    if not model_path:
        raise InputError("the SGLang command line has no --model-path")
    trust, distrust = remote_code_trust(cl)
    overrides = cl.value("json_model_override_args")
    model = resolve_model(model_path, revision=cl.value("revision"),
                          trust_remote_code=trust, override_args=overrides, isolate=isolate)
    draft = None
    draft_path = cl.value("speculative_draft_model_path")
    if draft_path or cl.value("speculative_algorithm"):
        draft = resolve_model(
            draft_path or model_path,
            revision=cl.value("speculative_draft_model_revision") or cl.value("revision"),
            trust_remote_code=trust, override_args=overrides, is_draft=True,
            isolate=isolate,
        )
    model = with_warning(model, distrust)
    return Inputs(cl, options, load_default_table(), model, draft, resolve_gpu(gpu_sm))


def default_state_dir() -> str:
    """`$SGLANG_GUARD_STATE_DIR`, else $XDG_STATE_HOME/sglang-guard (or /var/lib for root)."""
    env = os.environ.get("SGLANG_GUARD_STATE_DIR")
    if env:
        return env
    if os.geteuid() == 0 and not os.environ.get("XDG_STATE_HOME"):
        return "/var/lib/sglang-guard"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "sglang-guard")


def decide(inputs: Inputs, policy: PolicyConfig, state_dir: str) -> Decision:
    """Run preflight; derived YAMLs are named under `<state_dir>/derived`."""
    return preflight(inputs.cl, inputs.options, inputs.compat, model=inputs.model,
                     draft=inputs.draft, gpu=inputs.gpu, policy=policy,
                     derived_dir=str(Path(state_dir) / "derived"))


def write_derived(decision: Decision) -> None:
    """Write the derived SGLang YAML that `argv_out` points at (atomically)."""
    if decision.derived_yaml is None or decision.derived_path is None:
        return
    target = Path(decision.derived_path)
    try:
        write_private(target, dump_yaml(decision.derived_yaml), find_config_path(decision.argv_in))
    except OSError as exc:
        raise InputError(
            f"cannot write the derived SGLang config {target}: {exc.strerror}"
        ) from None
