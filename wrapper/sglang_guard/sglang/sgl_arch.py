"""MLA/SSM architecture lists and draft-model renames read from SGLang's model_config.py.

What is derived: the architecture names each `if` of ModelConfig tests (`"X" in
hf_config.architectures`, `architectures[0] in [...]` / `== "X"`) and the attention arch its
body assigns; the draft renames (`architectures[0] = "Y"` under `is_draft_model`). What is not:
the field tests beside the names (`getattr(text_config, "kv_lora_rank") is not None`): such
names are listed under `*_conditional` and the exact conditions stay curated by hand in
configs/attention-arch.toml.
"""

from __future__ import annotations

import ast
from typing import Any

from sglang_guard.sglang.sgl_ast import Evaluator, Reader, Scope, Unknown

MODEL_CONFIG = "sglang.srt.configs.model_config"


def _mentions_arch(node: ast.AST) -> bool:
    return "architectures" in ast.unparse(node)


def _arch_names(test: ast.expr, scope: Scope) -> list[tuple[str, bool]]:
    """(architecture name, whether an `and` beside it tests something else) for each name."""
    out: list[tuple[str, bool]] = []

    def visit(node: ast.expr, guarded: bool) -> None:
        if isinstance(node, ast.BoolOp):
            mixed = isinstance(node.op, ast.And) and not all(
                _is_arch_compare(v) or _is_draft_flag(v) for v in node.values
            )
            for v in node.values:
                visit(v, guarded or mixed)
        elif _is_arch_compare(node) and isinstance(node, ast.Compare):
            for part in [node.left, *node.comparators]:
                if isinstance(part, ast.Name | ast.Attribute) and not _mentions_arch(part):
                    try:
                        out.extend((str(n), guarded) for n in scope.eval(part))
                    except (Unknown, TypeError):
                        continue
                    continue
                for c in ast.walk(part):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        out.append((c.value, guarded))

    visit(test, False)
    return out


def _is_draft_flag(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "is_draft_model"


def _is_arch_compare(node: ast.expr) -> bool:
    return isinstance(node, ast.Compare) and _mentions_arch(node) and any(
        isinstance(c, ast.Constant | ast.Name | ast.List | ast.Tuple | ast.Set)
        and not _mentions_arch(c)
        for c in [*node.comparators, node.left]
    )


def _assigned_arch(body: list[ast.stmt]) -> str | None:
    for stmt in body:
        if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]).endswith(
            "attention_arch"
        ):
            text = ast.unparse(stmt.value)
            if text.startswith("AttentionArch."):
                return text.split(".")[1].lower()
    return None


def _draft_rename(body: list[ast.stmt]) -> tuple[str, bool] | None:
    """(new architecture, whether it depends on a further test) of a draft-rename body."""
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            target = ast.unparse(stmt.targets[0])
            value = stmt.value
            if target.endswith("architectures") and isinstance(value, ast.List) and value.elts:
                value = value.elts[0]
            elif not target.endswith("architectures[0]"):
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value, False
        if isinstance(stmt, ast.If) and not _mentions_arch(stmt.test):
            # e.g. DeepSeek-V4: a DSpark head if the checkpoint bundles one, else NextN;
            # the `else` is the default path.
            inner = _draft_rename(stmt.orelse)
            if inner is not None:
                return inner[0], True
    return None


def arch_lists(read: Reader) -> dict[str, Any]:
    """The release's MLA / SSM lists and draft renames, with the lines they come from."""
    ev = Evaluator(read)
    try:
        mod = ev.module(MODEL_CONFIG)
    except Unknown:
        return {"source": None}
    out: dict[str, Any] = {
        "source": mod.path,
        "mla": [], "mla_conditional": [], "mha": [], "ssm": [],
        "draft_renames": {}, "draft_renames_conditional": {}, "lines": {},
    }
    scope = Scope(ev, MODEL_CONFIG)
    for node in ast.walk(mod.tree):
        if not isinstance(node, ast.If) or not _mentions_arch(node.test):
            continue
        names = _arch_names(node.test, scope)
        if not names:
            continue
        arch = _assigned_arch(node.body)
        if arch is not None:
            for name, guarded in names:
                key = f"{arch}_conditional" if guarded and arch == "mla" else arch
                if name not in out[key]:
                    out[key].append(name)
                    out["lines"].setdefault(name, node.lineno)
        renamed = _draft_rename(node.body)
        if renamed is not None and "is_draft_model" in ast.unparse(node.test):
            for name, guarded in names:
                key = "draft_renames_conditional" if guarded or renamed[1] else "draft_renames"
                out[key].setdefault(name, renamed[0])
    try:
        ssm = ev.name(MODEL_CONFIG, "PURE_SSM_ARCHITECTURES")
        out["ssm"] = list(dict.fromkeys([*out["ssm"], *ssm]))
    except Unknown:
        pass
    return out
