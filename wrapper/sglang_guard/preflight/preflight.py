"""Preflight: a pure function of (command line, model facts, GPU facts, policy) -> decision.

Same inputs, same `argv_out`, on every node of a multi-node deployment: nothing here reads
the clock, the environment or the disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, replace
from typing import Any, Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sglang_guard.common.record import record
from sglang_guard.config.guardconfig import PolicyConfig
from sglang_guard.preflight.compat import (
    BACKEND_FLAGS,
    CompatTable,
    Problem,
    best_fit,
    check_backend,
    check_kv4,
    check_kv_sm,
)
from sglang_guard.preflight.facts import GpuFacts, ModelFacts
from sglang_guard.preflight.parsecheck import PARSER_SOURCE, Rejection, rejections, sglang_error
from sglang_guard.preflight.sizes import CITED, check_sizes, policy_action
from sglang_guard.preflight.spelling import new_tokens, respell
from sglang_guard.sglang.argv import CommandLine, effective_value
from sglang_guard.sglang.edits import Edit, apply_edits
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.renames import RenameFinding

# What the policy did about one finding (a rule's fix is a FixKind, the machine's request to
# the shell an `actions.Action`).
FindingAction = Literal["drop", "rewrite", "refuse", "warn"]
# "rejected": the release's own parser rejects the command line (SGLang exits 2 on it).
Verdict = Literal["ok", "remediated", "refused", "rejected"]
DRAFT_FLAG = "--speculative-draft-attention-backend"
# Value flags whose invalid choice the policy may drop (SGLang then picks its own default),
# beyond the backend flags that preflight/compat.py judges.
POLICY_CHOICE_FLAGS = ("--kv-cache-dtype", "--mm-attention-backend")
# KV dtypes SGLang renamed: 0.5.16-0.5.20 still take the old value on the command line and
# raise at model load ("--kv-cache-dtype=fp4_e2m1 is deprecated. Use
# --kv-cache-dtype=fp4_mx_block16.", sglang/srt/mem_cache/kv_cache_dtype.py:59 of 0.5.16,
# :67 of 0.5.20); 0.5.21 and later drop it from the choices. (value, new, raising releases)
KV_RENAMED = (("fp4_e2m1", "fp4_mx_block16", ">=0.5.16,<=0.5.20",
               "sglang/srt/mem_cache/kv_cache_dtype.py:59 (0.5.16; :67 in 0.5.20)"),)


@record
class Finding:
    """One flag that does not fit, and what the policy did about it."""

    flag: str
    value: str | None
    action: FindingAction
    new_value: str | None
    reason: str
    kind: str
    source: str | None = None
    sglang_message: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of `check --json`."""
        return {"flag": self.flag, "value": self.value, "action": self.action,
                "new_value": self.new_value, "reason": self.reason, "kind": self.kind,
                "source": self.source, "sglang_message": self.sglang_message}


@record
class Decision:
    """The outcome of preflight: the verdict, the fixed command line and why."""

    verdict: Verdict
    argv_in: tuple[str, ...]
    argv_out: tuple[str, ...]
    findings: tuple[Finding, ...]
    derived_yaml: Mapping[str, Any] | None = None
    derived_path: str | None = None
    warnings: tuple[str, ...] = field(default=())


def preflight(
    cl: CommandLine,
    options: OptionTable,
    compat: CompatTable,
    *,
    model: ModelFacts,
    draft: ModelFacts | None,
    gpu: GpuFacts,
    policy: PolicyConfig,
    derived_dir: str,
    allow_longer_context: bool = False,
    unconfirmed: frozenset[str] = frozenset(),
) -> Decision:
    """Check every backend flag of `cl`, then the sizes and combinations (preflight/sizes.py)."""
    warnings = [w for w in (model.warning, draft.warning if draft else None, gpu.warning) if w]
    warnings += list(gpu.notes)
    original = cl
    spelled = respell(cl, options, policy)  # the release's own spelling of renamed flags
    cl = spelled.cl
    warnings += list(spelled.warnings)
    findings: list[Finding] = [_renamed(f, "refuse") for f in spelled.refused]
    findings += [_renamed(f, "drop" if f.action == "drop" else "rewrite")
                 for f in spelled.changes]
    # Defaults count (issue 19, item 2): an absent --kv-cache-dtype is checked as the
    # release's default (`auto`), the string SGLang's own argument checks compare.
    kv_dtype, kv_default = effective_value(cl, options, "kv_cache_dtype")
    edits: list[Edit] = []
    for flag in BACKEND_FLAGS:
        spec = options.get(flag)
        if spec is None:  # a flag this release lacks: its parser rejects it (below)
            continue
        occ = cl.last(spec.dest)
        if occ is None or occ.value is None:
            continue
        facts = (draft or model) if flag == DRAFT_FLAG else model
        problems = check_backend(compat, flag, occ.value, arch=facts.attention_arch,
                                 sm=_sm(gpu), kv_cache_dtype=kv_dtype,
                                 model_fields=_fields(facts),
                                 architecture=next(iter(facts.architectures), None),
                                 architectures=facts.architectures)
        fatal = [p for p in problems if p.fatal]
        warnings += [f"{p.flag} {p.value}: {p.reason}" for p in problems if not p.fatal]
        if not fatal:
            continue
        finding = _apply_policy(compat, policy, flag, occ.value, fatal,
                                facts=facts, gpu=gpu, kv_dtype=kv_dtype)
        if kv_default and any(p.kind == "kv_cache_dtype" for p in fatal):
            finding = replace(finding, reason=f"{finding.reason} (--kv-cache-dtype is not "
                              f"given: {kv_dtype} is SGLang {options.sglang_version}'s default)")
        findings.append(finding)
        if finding.action == "drop":
            edits.append(Edit(spec.dest, "drop"))
        elif finding.action == "rewrite":
            edits.append(Edit(spec.dest, "set", finding.new_value))
    warnings += _add_kv4_findings(cl, options, compat, findings, edits, model=model, gpu=gpu,
                                  policy=policy)
    _add_size_findings(cl, options, findings, edits, model=model, gpu=gpu, policy=policy,
                       allow_longer_context=allow_longer_context, unconfirmed=unconfirmed)
    _add_parser_findings(cl, options, findings, edits, policy)
    _add_kv_deprecation(cl, options, findings, edits, policy)
    result = apply_edits(cl, options, edits, derived_dir)
    verdict: Verdict = "ok"
    if any(f.kind == "parser" for f in findings):
        verdict = "rejected"
    elif any(f.action == "refuse" for f in findings):
        verdict = "refused"
    elif result.argv != original.argv or result.derived_yaml is not None:
        verdict = "remediated"
    return Decision(
        verdict=verdict,
        argv_in=original.argv,
        argv_out=original.argv if verdict in ("refused", "rejected") else result.argv,
        findings=tuple(findings),
        derived_yaml=None if verdict in ("refused", "rejected") else result.derived_yaml,
        derived_path=None if verdict in ("refused", "rejected") else result.derived_path,
        warnings=tuple(dict.fromkeys(warnings)),
    )


def _add_size_findings(cl: CommandLine, options: OptionTable, findings: list[Finding],
                       edits: list[Edit], *, model: ModelFacts, gpu: GpuFacts,
                       policy: PolicyConfig, allow_longer_context: bool,
                       unconfirmed: frozenset[str]) -> None:
    """The size and combination checks; a flag the backend checks already judged is skipped.
    A check in `unconfirmed` (a release newer than the tables whose source does not confirm
    it, sizes.confirm) only warns."""
    judged = {f.flag for f in findings}
    for item in check_sizes(cl, model, sm=_sm(gpu), allow_longer_context=allow_longer_context,
                            release=options.sglang_version):
        if item.flag in judged:
            continue
        judged.add(item.flag)
        action = policy_action(policy, item)
        reason = item.reason
        if item.check.source in unconfirmed:
            action = "warn"
            reason += (" (not confirmed in the running release's own source, which is newer "
                       "than the tables: warn only, launched unchanged)")
        elif action == "warn":
            reason += " (policy warn: launched unchanged)"
        findings.append(Finding(flag=item.flag, value=item.value, action=action, new_value=None,
                                reason=reason, kind=item.check.kind,
                                source=f"{item.cited} (line of {CITED}; the same rule in "
                                       f"{item.check.releases})",
                                sglang_message=item.sglang_message))
        spec = options.get(item.flag)
        if action == "drop" and spec is not None:
            edits.append(Edit(spec.dest, "drop"))


def _add_parser_findings(cl: CommandLine, options: OptionTable, findings: list[Finding],
                         edits: list[Edit], policy: PolicyConfig) -> None:
    """What the release's parser rejects (preflight/parsecheck.py). An invalid choice of a backend
    or KV-dtype flag follows the policy (the backend flags were judged above); anything else
    is rejected: SGLang exits 2 on it before loading anything."""
    found = rejections(cl, options)
    message = sglang_error(found)
    backend = {s.dest for s in map(options.get, BACKEND_FLAGS) if s is not None}
    by_policy = {s.dest: s.canonical for s in map(options.get, POLICY_CHOICE_FLAGS) if s}
    version = options.sglang_version
    for r in found:
        choice = r.dest is not None and "invalid choice" in r.problem
        if choice and r.dest in backend:
            continue  # check_backend judged it (kind unknown_backend)
        hint = f" (did you mean {r.hint}?)" if r.hint else ""
        base: dict[str, Any] = {"flag": r.flag, "value": r.value, "source": PARSER_SOURCE,
                                "sglang_message": message}
        name = r.flag.split("=", 1)[0]
        if r.dest is None and name in (*BACKEND_FLAGS, *POLICY_CHOICE_FLAGS) \
                and (r.span is not None or r.yaml_key is not None):
            # A backend/KV flag of other releases that this one lacks (0.5.1-0.5.6.post2
            # have no --speculative-draft-attention-backend): the policy decides.
            findings.append(_absent_option(r, name, version, policy, base))
            if findings[-1].action == "drop":
                edits.append(Edit("", "drop", span=r.span, yaml_key=r.yaml_key))
            continue
        if choice and r.dest in by_policy:
            flag = by_policy[r.dest]
            mode = policy.mode(flag)
            why = f"SGLang {version}'s parser rejects it ({r.problem})"
            renamed = _renamed_kv(r.value, options) if flag == "--kv-cache-dtype" else None
            if mode == "rewrite" and renamed is not None:
                findings.append(Finding(action="rewrite", new_value=renamed[0],
                                        kind="invalid_choice",
                                        reason=f"{why}; SGLang renamed {r.value} to "
                                               f"{renamed[0]} ({renamed[1]})", **base))
                edits.append(Edit(r.dest, "set", renamed[0]))
                continue
            if mode == "fail":
                findings.append(Finding(action="refuse", new_value=None, reason=why,
                                        kind="invalid_choice", **base))
            elif mode == "warn":
                findings.append(Finding(action="warn", new_value=None, kind="invalid_choice",
                                        reason=f"{why} (policy warn: launched unchanged)",
                                        **base))
            else:
                findings.append(Finding(action="drop", new_value=None, kind="invalid_choice",
                                        reason=f"{why}; dropped so SGLang picks its own "
                                               "default", **base))
                edits.append(Edit(r.dest, "drop"))
            continue
        findings.append(Finding(action="refuse", new_value=None, kind="parser",
                                reason=f"SGLang {version}'s parser rejects it: "
                                       f"{r.problem}{hint}", **base))


def _absent_option(r: Rejection, name: str, version: str, policy: PolicyConfig,
                   base: dict[str, Any]) -> Finding:
    """A backend/KV flag the release's parser does not have, under the flag's policy."""
    mode = policy.mode(name)
    why = f"SGLang {version} has no {name} option; its parser rejects it ({r.problem})"
    base = {**base, "flag": name, "kind": "absent_option"}
    if mode == "fail":
        return Finding(action="refuse", new_value=None, reason=why, **base)
    if mode == "warn":
        return Finding(action="warn", new_value=None,
                       reason=f"{why} (policy warn: launched unchanged)", **base)
    return Finding(action="drop", new_value=None,
                   reason=f"{why}; dropped so SGLang {version} does what it does without it",
                   **base)


def _renamed_kv(value: str | None, options: OptionTable) -> tuple[str, str] | None:
    """The renamed KV dtype of `value` when this release has it: (new value, source)."""
    spec = options.get("kv_cache_dtype")
    for old, new, _, source in KV_RENAMED:
        if value == old and spec is not None and new in (spec.choices or ()):
            return new, source
    return None


def _add_kv_deprecation(cl: CommandLine, options: OptionTable, findings: list[Finding],
                        edits: list[Edit], policy: PolicyConfig) -> None:
    """A KV dtype the release still parses but refuses at model load (KV_RENAMED)."""
    occ = cl.last("kv_cache_dtype")
    if occ is None or occ.value is None or occ.problem:
        return
    try:
        release = Version(options.sglang_version)
    except InvalidVersion:
        return
    for old, new, releases, source in KV_RENAMED:
        if occ.value != old or release not in SpecifierSet(releases):
            continue
        flag = "--kv-cache-dtype"
        mode = policy.mode(flag)
        message = f"--kv-cache-dtype={old} is deprecated. Use --kv-cache-dtype={new}."
        why = f"SGLang {options.sglang_version} takes {old} on its command line, then " \
              f"raises at model load: {old} was renamed to {new}"
        base: dict[str, Any] = {"flag": flag, "value": old, "kind": "renamed_value",
                                "source": source, "sglang_message": message}
        if mode == "fail":
            findings.append(Finding(action="refuse", new_value=None, reason=why, **base))
        elif mode == "warn":
            findings.append(Finding(action="warn", new_value=None,
                                    reason=f"{why} (policy warn: launched unchanged)", **base))
        elif mode == "rewrite":
            findings.append(Finding(action="rewrite", new_value=new,
                                    reason=f"{why}; rewritten to {new}", **base))
            edits.append(Edit("kv_cache_dtype", "set", new))
        else:
            findings.append(Finding(action="drop", new_value=None,
                                    reason=f"{why}; dropped so SGLang picks its own default",
                                    **base))
            edits.append(Edit("kv_cache_dtype", "drop"))


def _renamed(f: RenameFinding, action: FindingAction) -> Finding:
    """A rename (or removal) the release made, as a finding."""
    new = " ".join(new_tokens(f)) or None
    return Finding(flag=f.flag, value=f.value, action=action, new_value=new, reason=f.reason,
                   kind="renamed" if f.action == "rename" else "removed", source=f.source)


def _fields(facts: ModelFacts) -> frozenset[str] | None:
    """The config fields the backend table asks about that the model has (None: not read)."""
    if facts.shape is None or facts.shape.config_fields is None:
        return None
    return frozenset(facts.shape.config_fields)


def _sm(gpu: GpuFacts) -> int | None:
    """The SM the checks use; 0 stands for "no NVIDIA GPU on this host" (`--gpu-sm none`)."""
    return 0 if gpu.source == "none" else gpu.sm


def _apply_policy(
    compat: CompatTable,
    policy: PolicyConfig,
    flag: str,
    value: str,
    problems: list[Problem],
    *,
    facts: ModelFacts,
    gpu: GpuFacts,
    kv_dtype: str | None,
) -> Finding:
    first = problems[0]
    reason = "; ".join(dict.fromkeys(p.reason for p in problems))
    base: dict[str, Any] = {"flag": flag, "value": value, "kind": first.kind,
                            "source": first.source, "sglang_message": first.sglang_message}
    mode = policy.mode(flag)
    if mode == "fail":
        return Finding(action="refuse", new_value=None, reason=reason, **base)
    if mode == "warn":
        return Finding(action="warn", new_value=None,
                       reason=f"{reason} (policy warn: launched unchanged)", **base)
    if mode == "rewrite":
        target, why = _rewrite_target(compat, policy, flag, value,
                                      facts=facts, gpu=gpu, kv_dtype=kv_dtype)
        if target is not None:
            return Finding(action="rewrite", new_value=target, reason=f"{reason}; {why}", **base)
        reason = f"{reason}; {why}"
    return Finding(action="drop", new_value=None,
                   reason=f"{reason}; dropped so SGLang picks its own default", **base)


def _rewrite_target(
    compat: CompatTable,
    policy: PolicyConfig,
    flag: str,
    value: str,
    *,
    facts: ModelFacts,
    gpu: GpuFacts,
    kv_dtype: str | None,
) -> tuple[str | None, str]:
    """The replacement: the guard config's map first, else the table's best fit."""
    mapping = policy.rewrite.get(flag, {})
    explicit = mapping.get(value, mapping.get("*"))
    sm = _sm(gpu)
    if explicit is not None:
        bad = [p for p in check_backend(compat, flag, explicit, arch=facts.attention_arch,
                                        sm=sm, kv_cache_dtype=kv_dtype) if p.fatal]
        if not bad:
            return explicit, f"rewritten to {explicit} (guard config policy.rewrite)"
        return None, f"the configured rewrite {explicit} does not fit either ({bad[0].reason})"
    fit = best_fit(compat, flag, arch=facts.attention_arch, sm=sm, kv_cache_dtype=kv_dtype)
    if fit is None:
        return None, "no backend in the table is known to fit this model and GPU"
    return fit[0], f"rewritten to {fit[0]}: {fit[1]}"


def _add_kv4_findings(cl: CommandLine, options: OptionTable, compat: CompatTable,
                      findings: list[Finding], edits: list[Edit], *, model: ModelFacts,
                      gpu: GpuFacts, policy: PolicyConfig) -> list[str]:
    """SGLang's KV dtype SM checks (compat.check_kv_sm) and FP4 KV cache checks
    (compat.check_kv4); a flag already judged is skipped. Returns the warnings.

    A KV dtype the GPU cannot run is dropped (SGLang's default KV dtype); a backend off
    SGLang's KV4 list is rewritten to the first listed one that fits, or dropped.
    """
    backends = {}
    for flag in BACKEND_FLAGS:
        occ = cl.last(options.spec(flag).dest) if flag in options.by_string else None
        backends[flag] = occ.value if occ is not None else None
    judged = {f.flag for f in findings}
    kv = cl.value("kv_cache_dtype")
    # A dtype the GPU cannot run at all (SGLang refuses it before any backend check).
    problems = check_kv_sm(compat, kv=kv, sm=_sm(gpu))
    notes = [f"{p.flag} {p.value}: {p.reason}" for p in problems if not p.fatal]
    problems = tuple(p for p in problems if p.fatal) or check_kv4(
        compat, kv=kv, arch=model.attention_arch, sm=_sm(gpu), backends=backends)
    if any(p.flag == "--kv-cache-dtype" for p in problems):
        problems = tuple(p for p in problems if p.flag == "--kv-cache-dtype")
    for p in problems:
        if p.flag in judged:
            continue
        mode = policy.mode(p.flag)

        def finding(action: FindingAction, reason: str, new: str | None = None,
                    p: Problem = p) -> Finding:
            return Finding(flag=p.flag, value=p.value, action=action, new_value=new,
                           reason=reason, kind=p.kind, source=p.source,
                           sglang_message=p.sglang_message)

        if mode == "fail":
            findings.append(finding("refuse", p.reason))
            continue
        if mode == "warn":
            findings.append(finding("warn", f"{p.reason} (policy warn: launched unchanged)"))
            continue
        dest = options.spec(p.flag).dest
        target = None
        lists_apply = compat.kv4 is not None and not (
            kv == compat.kv4.sm_dtype and compat.kv4.prefill_backends)
        if p.flag == "--attention-backend" and mode == "rewrite" and lists_apply \
                and compat.kv4 is not None:
            listed = next((names for arch, names, _ in compat.kv4.lists
                           if arch == model.attention_arch), ())
            target = next((n for n in listed if n in compat.names and not any(
                q.fatal for q in check_backend(compat, p.flag, n, arch=model.attention_arch,
                                               sm=_sm(gpu), kv_cache_dtype=kv))), None)
        if target is not None:
            findings.append(finding("rewrite", f"{p.reason}; rewritten to {target}, the first "
                                    "of SGLang's list that fits", target))
            edits.append(Edit(dest, "set", target))
        else:
            findings.append(finding("drop", f"{p.reason}; dropped so SGLang picks its own "
                                    "default"))
            edits.append(Edit(dest, "drop"))
    return notes
