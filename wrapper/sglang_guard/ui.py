"""How a preflight decision is shown: for people and as JSON, secrets masked in both."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sglang_guard.sglang.redact import (
    MASK,
    is_secret_flag,
    redact_argv,
    redact_config,
    redact_record,
    redact_text,
)

if TYPE_CHECKING:
    from sglang_guard.preflight.preflight import Decision
    from sglang_guard.preflight.shell.inputs import Inputs


def decision_json(decision: Decision, inputs: Inputs) -> dict[str, Any]:
    """The `check --json` object. Secrets are masked as in the human output and the journal:
    a secret option's value (any spelling SGLang accepts), a derived YAML key that is one,
    and key=value or token-shaped words in free text."""
    model, gpu, draft, table = inputs.model, inputs.gpu, inputs.draft, inputs.options
    return {
        "verdict": decision.verdict,
        "argv_in": redact_argv(decision.argv_in, table),
        "argv_out": redact_argv(decision.argv_out, table),
        "derived_config": (
            redact_config(decision.derived_yaml) if decision.derived_yaml is not None else None
        ),
        "derived_config_path": decision.derived_path,
        "model": {"path": redact_text(model.path), "architectures": list(model.architectures),
                  "attention_arch": model.attention_arch, "model_type": model.model_type},
        "draft_model": None if draft is None else {
            "path": redact_text(draft.path), "architectures": list(draft.architectures),
            "attention_arch": draft.attention_arch},
        "gpu": {"sm": gpu.sm, "name": gpu.name, "source": gpu.source},
        "sglang_version": inputs.release.version,
        "sglang_version_source": inputs.release.source,
        "sglang_table": inputs.release.tables.release,
        "findings": [redact_record(f.as_dict()) for f in decision.findings],
        "warnings": [redact_text(w) for w in decision.warnings],
    }


def render_decision(decision: Decision, inputs: Inputs,
                    head: Sequence[str] = ("python", "-m", "sglang.launch_server")) -> str:
    """A short human report: what was found, why, and the command line to run, starting
    with `head` (the checked line's own launcher: sglang/launcher.Launch.head)."""
    model, gpu, table = inputs.model, inputs.gpu, inputs.options
    archs = ", ".join(model.architectures) or "?"
    lines = [redact_text(f"model     {model.path}  [{archs}]  attention: {model.attention_arch}")]
    if inputs.draft is not None:
        d = inputs.draft
        lines.append(redact_text(f"draft     {d.path}  [{', '.join(d.architectures) or '?'}]  "
                                 f"attention: {d.attention_arch}"))
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
        secret = is_secret_flag(f.flag)  # its value is masked whole, as in the journal
        if secret and f.action == "rewrite":
            change = f"rewritten to {MASK}"
        what = f.flag if f.value is None else f"{f.flag} {MASK if secret else f.value}"
        lines.append(redact_text(f"finding   {what}: {change}"))
        lines.append(redact_text(f"          why: {f.reason}"))
        if f.sglang_message:
            lines.append(redact_text(f"          SGLang would fail with: {f.sglang_message}"))
    if decision.derived_path:
        lines.append(f"derived   {decision.derived_path} (your YAML minus/with the fixed keys; "
                     "`run` writes it, `check` only names it)")
    lines.append(f"verdict   {decision.verdict}")
    # The head's environment words may hold a token (HF_TOKEN=...): masked as free text.
    shown = [redact_text(word) for word in head]
    lines.append("command   " + shlex.join([*shown, *redact_argv(decision.argv_out, table)]))
    return "\n".join(lines)
