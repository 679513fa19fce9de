"""How a preflight decision is shown: for people (secrets masked) and as JSON (real values)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from sglang_guard.core.redact import redact_argv, redact_text

if TYPE_CHECKING:
    from sglang_guard.core.preflight import Decision
    from sglang_guard.shell.inputs import Inputs


def decision_json(decision: Decision, inputs: Inputs) -> dict[str, Any]:
    """The `check --json` object (argv values are real, not redacted: it is for machines)."""
    model, gpu, draft = inputs.model, inputs.gpu, inputs.draft
    return {
        "verdict": decision.verdict,
        "argv_in": list(decision.argv_in),
        "argv_out": list(decision.argv_out),
        "derived_config": (
            dict(decision.derived_yaml) if decision.derived_yaml is not None else None
        ),
        "derived_config_path": decision.derived_path,
        "model": {"path": model.path, "architectures": list(model.architectures),
                  "attention_arch": model.attention_arch, "model_type": model.model_type},
        "draft_model": None if draft is None else {
            "path": draft.path, "architectures": list(draft.architectures),
            "attention_arch": draft.attention_arch},
        "gpu": {"sm": gpu.sm, "name": gpu.name, "source": gpu.source},
        "sglang_version": inputs.release.version,
        "sglang_version_source": inputs.release.source,
        "sglang_table": inputs.release.tables.release,
        "findings": [f.as_dict() for f in decision.findings],
        "warnings": list(decision.warnings),
    }


def render_decision(decision: Decision, inputs: Inputs) -> str:
    """A short human report: what was found, why, and the command line to run."""
    model, gpu, table = inputs.model, inputs.gpu, inputs.options
    archs = ", ".join(model.architectures) or "?"
    lines = [f"model     {model.path}  [{archs}]  attention: {model.attention_arch}"]
    if inputs.draft is not None:
        d = inputs.draft
        lines.append(f"draft     {d.path}  [{', '.join(d.architectures) or '?'}]  "
                     f"attention: {d.attention_arch}")
    gpu_text = {"none": "none (no GPU on this host)", "unknown": "unknown"}.get(
        gpu.source, f"SM{gpu.sm}" + (f" ({gpu.name})" if gpu.name else ""))
    lines.append(f"gpu       {gpu_text}")
    rel = inputs.release
    table_note = "" if rel.tables.release == rel.version else f", table {rel.tables.release}"
    lines.append(f"sglang    {rel.version} ({rel.source}{table_note})")
    for w in decision.warnings:  # parse problems quote the user's tokens, secrets included
        lines.append(f"warning   {redact_text(w)}")
    if not decision.findings:
        lines.append("findings  none: every backend flag fits")
    for f in decision.findings:
        change = {"drop": "dropped", "rewrite": f"rewritten to {f.new_value}",
                  "refuse": "REFUSED", "warn": "kept (warn)"}[f.action]
        if f.kind == "parser":
            change = "REJECTED by SGLang's parser"
        what = f.flag if f.value is None else f"{f.flag} {f.value}"
        lines.append(redact_text(f"finding   {what}: {change}"))
        lines.append(redact_text(f"          why: {f.reason}"))
        if f.sglang_message:
            lines.append(redact_text(f"          SGLang would fail with: {f.sglang_message}"))
    if decision.derived_path:
        lines.append(f"derived   {decision.derived_path} (your YAML minus/with the fixed keys; "
                     "`run` writes it, `check` only names it)")
    lines.append(f"verdict   {decision.verdict}")
    argv = ["python", "-m", "sglang.launch_server", *redact_argv(decision.argv_out, table)]
    lines.append("command   " + shlex.join(argv))
    return "\n".join(lines)
