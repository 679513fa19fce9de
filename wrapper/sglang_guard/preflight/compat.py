"""Whether SGLang accepts an attention backend for a model, GPU and flag (configs/backends.toml)."""

from __future__ import annotations

from typing import Any, Literal

from sglang_guard.common.record import record
from sglang_guard.errors import InputError
from sglang_guard.preflight.compat_table import (
    ARCHS,
    PHASE_ORDER,
    Alias,
    Backend,
    CompatTable,
    Constraint,
    Kv4,
    Preference,
    load_default_table,
    parse_table,
)
from sglang_guard.sglang.options import BACKEND_FLAGS

__all__ = [
    "BACKEND_FLAGS",
    "Alias",
    "Backend",
    "CompatTable",
    "Constraint",
    "Preference",
    "Problem",
    "best_fit",
    "check_backend",
    "check_kv4",
    "check_kv_sm",
    "load_default_table",
    "parse_table",
]

# The table's slot names: --attention-backend fills both sides, so SGLang checks it under
# conditions of its own ("attention_backend == X"), distinct from the split flags.
_SLOT_OF_FLAG = dict(zip(BACKEND_FLAGS, ("attention", "prefill", "decode", "draft"), strict=True))
_ARCH_TEXT = {"mla": "MLA", "mha": "MHA", "ssm": "SSM"}
_ARCH_NEED = {"mla": "an MLA model", "mha": "a non-MLA (MHA) model", "ssm": "an SSM model"}
_PLATFORM_TEXT = {"rocm": "AMD ROCm", "npu": "Ascend NPU", "cpu": "CPU", "xpu": "Intel XPU"}
_ROLE_TEXT = {"prefill": "the prefill backend", "draft": "a speculative draft backend"}
# What SGLang's draft worker falls back to on CUDA (speculative_hook.py:927).
_DRAFT_FALLBACK = "flashinfer"

ProblemKind = Literal[
    "unknown_backend", "arch", "gpu", "role", "platform", "kv_cache_dtype", "deprecated",
    "model_field", "model_arch", "model",
]


@record
class Problem:
    """One reason SGLang would refuse (or rewrite) a backend flag."""

    flag: str
    value: str
    kind: ProblemKind
    reason: str
    sglang_message: str | None
    source: str | None
    fatal: bool
    canonical: str | None = None


class _Keep(dict[str, Any]):
    """Leaves a placeholder the checker cannot know (SGLang's platform class) as it is."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _fill(template: str | None, **values: Any) -> str | None:
    return None if template is None else template.format_map(_Keep(values))


def _in(sm: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(lo <= sm <= hi for lo, hi in ranges)


def _sm_text(ranges: tuple[tuple[int, int], ...]) -> str:
    parts = [f"SM{lo}" if lo == hi else f"SM{lo}-SM{hi}" for lo, hi in ranges]
    return " or ".join(parts)


def _gpu_rule_applies(backend: Backend, rule: Constraint, slot: str, arch: str, sm: int) -> bool:
    """A per-arch SM rule counts for its archs; with the arch unknown, only if no arch fits."""
    if not rule.archs:
        return True
    if arch != "unknown":
        return arch in rule.archs
    siblings = [c for c in backend.constraints if c.kind == "gpu" and c.archs and slot in c.slots]
    return not any(_in(sm, c.sms) for c in siblings)


def _violation(
    backend: Backend,
    rule: Constraint,
    slot: str,
    *,
    arch: str,
    sm: int | None,
    kv: str | None,
    fields: frozenset[str] | None = None,
    architectures: tuple[str, ...] | None = None,
) -> str | None:
    """The reason `rule` fails for these facts, or None when it holds or cannot be judged."""
    name = backend.name
    if rule.kind == "model_arch":
        if not architectures or set(architectures) & set(rule.architectures):
            return None
        return (f"{name} runs only a model of architecture {' or '.join(rule.architectures)}; "
                f"this one is {', '.join(architectures)}")
    if rule.kind == "model_field":
        if fields is None or rule.field in fields:
            return None
        return f"{name} needs a model whose config has {rule.field}; this one has none"
    if rule.kind == "role":
        verb = "cannot be" if rule.fatal else "is only partly supported as"
        note = f" ({rule.note})" if rule.note else ""
        return f"{name} {verb} {_ROLE_TEXT.get(slot, slot)}{note}"
    if rule.kind == "arch":
        if arch == "unknown" or arch in rule.archs:
            return None
        needs = " or ".join(_ARCH_NEED[a] for a in rule.archs)
        return f"{name} needs {needs}; this model is {_ARCH_TEXT[arch]}"
    if sm is None and (rule.kind != "kv_cache_dtype" or rule.sms):
        return None  # no GPU facts: GPU and platform rules are the caller's warning
    if rule.kind == "platform":
        if sm == 0:
            return None  # no NVIDIA GPU, but which platform it is (CPU, ROCm, NPU) is unknown
        return (
            f"{name} runs on {_PLATFORM_TEXT.get(rule.platform or '', rule.platform)} only; "
            f"this host has an NVIDIA GPU (SM{sm})"
        )
    if rule.kind == "gpu":
        assert sm is not None  # noqa: S101 -- narrowed by the early return above
        if _in(sm, rule.sms) or not _gpu_rule_applies(backend, rule, slot, arch, sm):
            return None
        scope = f" for {_ARCH_TEXT[arch]} models" if rule.archs and arch != "unknown" else ""
        return f"{name} needs {_sm_text(rule.sms)}{scope}; this GPU is SM{sm}"
    # kv_cache_dtype
    if kv is None or (rule.sms and (sm is None or not _in(sm, rule.sms))):
        return None
    if (rule.allowed and kv not in rule.allowed) or kv in rule.denied:
        where = f" on SM{sm}" if rule.sms else ""
        takes = f"; it takes {', '.join(rule.allowed)}" if rule.allowed else ""
        return f"{name} does not take --kv-cache-dtype {kv}{where}{takes}"
    return None


def _constraint_problems(
    table: CompatTable,
    backend: Backend,
    flag: str,
    value: str,
    *,
    arch: str,
    sm: int | None,
    kv: str | None,
    fields: frozenset[str] | None,
    architectures: tuple[str, ...] | None = None,
) -> list[Problem]:
    slot = _SLOT_OF_FLAG[flag]
    found: dict[str, tuple[Constraint, str]] = {}
    builds = arch != "ssm" or "build" not in table.ssm_skips_phases
    if sm == 0 and backend.platform == "cuda" and builds:
        # SM 0 is SGLang's "no CUDA device" (get_device_sm, utils/common.py:766): a CUDA
        # backend cannot work, whatever its SM rules say.
        no_gpu = Constraint(kind="platform", phase="build", source="", platform="cuda")
        found["platform"] = (no_gpu, f"{backend.name} needs an NVIDIA GPU; this host has none")
        found["gpu"] = (no_gpu, "")  # the SM rules say nothing more
    # A check the release's source does not confirm comes after those it does: it must not
    # hide a confirmed check of the same kind.
    for rule in sorted(backend.constraints, key=lambda c: c.unconfirmed):
        if slot not in rule.slots or rule.kind in found:
            continue  # SGLang stops at the first failure of each check
        if arch == "ssm" and rule.phase in table.ssm_skips_phases:
            continue  # a pure SSM model never builds the attention backend
        reason = _violation(backend, rule, slot, arch=arch, sm=sm, kv=kv, fields=fields,
                            architectures=architectures)
        if reason is not None:
            if rule.unconfirmed:
                reason += (f" (seen in SGLang {rule.sglang}, not confirmed in "
                           f"{table.sglang_version}'s source: a warning only)")
            found[rule.kind] = (rule, reason)
    # Argument checks run in the launcher before any backend is built: list what SGLang
    # would hit first, first.
    ordered = sorted(found.values(), key=lambda item: PHASE_ORDER[item[0].phase])
    return [
        Problem(
            flag=flag,
            value=value,
            kind=rule.kind,  # type: ignore[arg-type]  # validated by the table parser
            reason=reason,
            sglang_message=_fill(
                rule.message, value=value, sm=sm, kv_cache_dtype=kv, fallback=_DRAFT_FALLBACK
            ),
            source=_source(table, rule),
            fatal=rule.fatal,
        )
        for rule, reason in ordered
        if reason
    ]


def _source(table: CompatTable, rule: Constraint) -> str | None:
    """Where the check is: the running release's own line, or where it was read."""
    if not rule.source:
        return None
    if rule.unconfirmed:
        return f"{rule.source} (SGLang {rule.sglang})"
    return f"{rule.source} ({table.sglang_version})"


def _deprecation(
    table: CompatTable, alias: Alias, flag: str, value: str, *, slot: str, kv: str | None
) -> tuple[Problem, str, str | None]:
    """The deprecation finding, the backend SGLang really uses, and the KV dtype it sets."""
    canonical = (
        alias.canonical_prefill
        if slot == "prefill" and alias.canonical_prefill
        else (alias.canonical)
    )
    reason = f"{value} is a deprecated alias; SGLang 0.5.23 runs {canonical} instead"
    if alias.forces_kv_cache_dtype and slot in alias.forces_slots:
        if kv != alias.forces_kv_cache_dtype:
            reason += f" and sets --kv-cache-dtype {alias.forces_kv_cache_dtype}"
        kv = alias.forces_kv_cache_dtype
    problem = Problem(
        flag=flag,
        value=value,
        kind="deprecated",
        reason=reason,
        sglang_message=_fill(alias.message, flag=flag, value=value, canonical=alias.canonical),
        source=f"{alias.source} ({table.sglang_version})",
        fatal=False,
        canonical=canonical,
    )
    return problem, canonical, kv


def _validate_inputs(flag: str, arch: str) -> str:
    if flag not in _SLOT_OF_FLAG:
        raise InputError(f"{flag} is not an attention-backend flag ({', '.join(BACKEND_FLAGS)})")
    if arch not in ARCHS:
        raise InputError(f"unknown attention arch {arch!r} (one of {', '.join(ARCHS)})")
    return _SLOT_OF_FLAG[flag]


def check_backend(
    table: CompatTable,
    flag: str,
    value: str,
    *,
    arch: str,
    sm: int | None,
    kv_cache_dtype: str | None = None,
    model_fields: frozenset[str] | None = None,
    architecture: str | None = None,
    architectures: tuple[str, ...] | None = None,
) -> tuple[Problem, ...]:
    """Every problem SGLang would have with `flag value`, the ones it meets first first.

    `arch` is the attention arch of the model the flag serves (the draft model's for the
    draft flag); "unknown" skips the arch checks. `sm` None skips the GPU and platform
    checks; 0 means the host has no NVIDIA GPU (SGLang's own convention). `model_fields`:
    which of the config fields the table asks about the model has (None: not read).
    `architecture`: the model's architectures[0], for the model allow-lists.
    `architectures`: the model's config.json architectures (None or empty: not known), for
    the backends SGLang builds for some architectures only (kind model_arch).
    """
    slot = _validate_inputs(flag, arch)
    backend = table.backend(value)
    if backend is None:
        if slot == "draft":
            message, source = table.unknown_draft_message, table.unknown_draft_source
        else:
            message, source = table.unknown_message, table.unknown_source
        choices = ", ".join(repr(name) for name in table.names)
        return (
            Problem(
                flag=flag,
                value=value,
                kind="unknown_backend",
                reason=f"{value!r} is not an attention backend of SGLang {table.sglang_version}",
                sglang_message=_fill(message, flag=flag, value=value, choices=choices),
                source=f"{source} ({table.sglang_version})",
                fatal=True,
            ),
        )
    problems: list[Problem] = []
    kv = kv_cache_dtype
    if backend.alias is not None:
        deprecated, canonical, kv = _deprecation(
            table, backend.alias, flag, value, slot=slot, kv=kv
        )
        problems.append(deprecated)
        target = table.backend(canonical)
        assert target is not None  # noqa: S101 -- the parser checks alias targets exist
        backend = target
    problems += _model_list_problems(table, flag, value, slot, architecture)
    problems += _constraint_problems(table, backend, flag, value, arch=arch, sm=sm, kv=kv,
                                     fields=model_fields, architectures=architectures)
    return tuple(problems)


def _model_list_problems(table: CompatTable, flag: str, value: str, slot: str,
                         architecture: str | None) -> list[Problem]:
    """A model whose SGLang argument phase takes only some backends (GptOssForCausalLM)."""
    if architecture is None or slot == "draft":
        return []
    out = []
    for entry in table.model_lists:
        if entry.architecture != architecture or value in entry.allowed \
                or slot not in entry.slots:
            continue
        allowed = ", ".join(entry.allowed)
        out.append(Problem(
            flag=flag, value=value, kind="model",
            reason=f"SGLang {table.sglang_version} runs {architecture} only on {allowed}",
            sglang_message=_fill(entry.message, supported_backends=list(entry.allowed)),
            source=f"{entry.source} ({table.sglang_version})", fatal=True))
    return out


def check_kv4(table: CompatTable, *, kv: str | None, arch: str, sm: int | None,
              backends: dict[str, str | None]) -> tuple[Problem, ...]:
    """SGLang's FP4 KV cache checks for this command line (its handle_kv4_compatibility).

    `backends`: the values of BACKEND_FLAGS on the command line (None: absent). The backend
    list is checked only where SGLang's own test is sure to see one backend on both sides:
    --attention-backend given, neither split flag, and not fa4.
    """
    rules = table.kv4
    if rules is None or kv is None or kv not in rules.dtypes:
        return ()
    release = table.sglang_version
    out: list[Problem] = []
    if (rules.sm_source and kv == rules.sm_dtype and sm is not None and sm != 0
            and not _in(sm, rules.sms)):
        out.append(Problem(
            flag="--kv-cache-dtype", value=kv, kind="gpu",
            reason=f"--kv-cache-dtype {kv} needs {_sm_text(rules.sms)}; this GPU is SM{sm}",
            sglang_message=rules.sm_message, source=f"{rules.sm_source} ({release})",
            fatal=True))
    if out:
        return tuple(out)  # the dtype goes: what follows is moot
    if kv == rules.sm_dtype and rules.prefill_backends:
        # SGLang resolves NVFP4's prefill and decode backends itself (then split: the
        # KV4 lists below only warn there).
        return tuple(_nvfp4_prefill(rules, release, sm, backends))
    value = backends.get("--attention-backend")
    split = backends.get("--prefill-attention-backend") or backends.get(
        "--decode-attention-backend")
    if value is None or split or value == "fa4" or arch not in ("mla", "mha"):
        return tuple(out)
    for list_arch, names, source in rules.lists:
        if list_arch != arch or value in names:
            continue
        message = dict(rules.messages).get(arch)
        out.append(Problem(
            flag="--attention-backend", value=value, kind="kv_cache_dtype",
            reason=(f"with --kv-cache-dtype {kv}, SGLang {release} takes only "
                    f"{', '.join(names)} for {_ARCH_TEXT[arch]} models"),
            sglang_message=_fill(message, choices=list(names), value=value),
            source=f"{source} ({release})", fatal=True))
    return tuple(out)


def check_kv_sm(table: CompatTable, *, kv: str | None, sm: int | None) -> tuple[Problem, ...]:
    """A --kv-cache-dtype that SGLang's argument phase refuses on this GPU (table.kv_sm).

    Judged only on a known NVIDIA GPU (sm None or 0: no facts). Where the release's parser
    takes the dtype but its source has no check, the finding only warns.
    """
    if kv is None or sm is None or sm == 0:
        return ()
    release = table.sglang_version
    out = []
    for rule in table.kv_sm:
        if rule.dtype != kv or _in(sm, rule.sms):
            continue
        reason = f"--kv-cache-dtype {kv} needs {_sm_text(rule.sms)}; this GPU is SM{sm}"
        if rule.source is None:
            reason += f" (SGLang {release}'s source does not confirm it: a warning only)"
        out.append(Problem(
            flag="--kv-cache-dtype", value=kv, kind="gpu", reason=reason,
            sglang_message=rule.message if rule.source else None,
            source=f"{rule.source} ({release})" if rule.source else None,
            fatal=rule.source is not None))
    return tuple(out)


def _nvfp4_prefill(rules: Kv4, release: str, sm: int | None,
                   backends: dict[str, str | None]) -> list[Problem]:
    """handle_nvfp4_prefill_kv_dequant_dtype: the explicit prefill (else attention) backend
    must give a dequant dtype; native NVFP4 prefill needs SM10x; decode must be trtllm_mha."""
    by_backend = {b: d for d, b in rules.prefill_backends}
    sources, messages = dict(rules.prefill_sources), dict(rules.prefill_messages)
    out: list[Problem] = []

    def problem(flag: str, value: str, key: str, reason: str) -> Problem:
        return Problem(flag=flag, value=value, kind="kv_cache_dtype", reason=reason,
                       sglang_message=messages.get(key), source=f"{sources[key]} ({release})",
                       fatal=True)

    flag = ("--prefill-attention-backend" if backends.get("--prefill-attention-backend")
            else "--attention-backend")
    explicit = backends.get(flag)
    if explicit is not None:
        dtype = by_backend.get(explicit)
        if dtype is None:
            out.append(problem(flag, explicit, "neither", (
                f"with --kv-cache-dtype nvfp4, SGLang {release} prefills only on "
                f"{' or '.join(by_backend)} (an FP8 workspace or native NVFP4)")))
        elif dtype == "nvfp4" and sm is not None and sm != 0 and not 100 <= sm <= 109:
            out.append(problem(flag, explicit, "sm100", (
                f"{explicit} prefills NVFP4 natively, which SGLang {release} runs on SM100 "
                f"only; this GPU is SM{sm}")))
    decode = backends.get("--decode-attention-backend")
    if decode is not None and decode != "trtllm_mha":
        out.append(problem("--decode-attention-backend", decode, "decode", (
            f"with --kv-cache-dtype nvfp4, SGLang {release} decodes on trtllm_mha only")))
    return out


def _preference(table: CompatTable, arch: str, sm: int | None) -> Preference | None:
    for pref in table.preferences:
        if arch not in pref.archs:
            continue
        if sm is None and pref.sms_mode == "unknown":
            return pref
        if sm is not None and (
            pref.sms_mode == "any" or (pref.sms_mode == "ranges" and _in(sm, pref.sms))
        ):
            return pref
    return None


def best_fit(
    table: CompatTable,
    flag: str,
    *,
    arch: str,
    sm: int | None,
    kv_cache_dtype: str | None = None,
) -> tuple[str, str] | None:
    """The preferred backend for this model and GPU on `flag`, and why; None if none fits.

    A candidate with no problem at all wins over one with only non-fatal ones (which SGLang
    would rewrite itself, e.g. fa3 with an fp8_e5m2 KV cache becomes triton).
    """
    _validate_inputs(flag, arch)
    pref = _preference(table, arch, sm)
    if pref is None:
        return None
    passed_over: list[str] = []
    tolerable: tuple[str, str] | None = None
    for candidate in pref.candidates:
        problems = check_backend(
            table, flag, candidate, arch=arch, sm=sm, kv_cache_dtype=kv_cache_dtype
        )
        why = pref.why + "".join(f"; passed over {p}" for p in passed_over)
        if not problems:
            return candidate, why
        if tolerable is None and not any(p.fatal for p in problems):
            tolerable = (candidate, why)
        passed_over.append(f"{candidate} ({problems[0].reason})")
    return tolerable
