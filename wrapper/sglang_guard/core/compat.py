"""Whether SGLang accepts an attention backend for a model, GPU and flag (configs/backends.toml)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any, Literal

from sglang_guard.errors import ConfigError, InputError
from sglang_guard.resources import config_path

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
    "load_default_table",
    "parse_table",
]

BACKEND_FLAGS: tuple[str, ...] = (
    "--attention-backend",
    "--prefill-attention-backend",
    "--decode-attention-backend",
    "--speculative-draft-attention-backend",
)
# The table's slot names: --attention-backend fills both sides, so SGLang checks it under
# conditions of its own ("attention_backend == X"), distinct from the split flags.
_SLOT_OF_FLAG = dict(zip(BACKEND_FLAGS, ("attention", "prefill", "decode", "draft"), strict=True))
_PHASE_ORDER = {"args": 0, "build": 1, "worker": 2, "kernel": 3}
_ARCH_TEXT = {"mla": "MLA", "mha": "MHA", "ssm": "SSM"}
_ARCH_NEED = {"mla": "an MLA model", "mha": "a non-MLA (MHA) model", "ssm": "an SSM model"}
_PLATFORM_TEXT = {"rocm": "AMD ROCm", "npu": "Ascend NPU", "cpu": "CPU", "xpu": "Intel XPU"}
_ROLE_TEXT = {"prefill": "the prefill backend", "draft": "a speculative draft backend"}
# What SGLang's draft worker falls back to on CUDA (speculative_hook.py:927).
_DRAFT_FALLBACK = "flashinfer"

ProblemKind = Literal[
    "unknown_backend", "arch", "gpu", "role", "platform", "kv_cache_dtype", "deprecated"
]


@dataclass(frozen=True, slots=True)
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


# ------------------------------------------------------------------ the table as values

ARCHS: tuple[str, ...] = ("mla", "mha", "ssm", "unknown")
_SLOTS = ("attention", "prefill", "decode", "draft")
_KINDS = ("arch", "gpu", "role", "platform", "kv_cache_dtype")
_PLATFORMS = ("any", "cuda", "rocm", "npu", "cpu", "xpu")
Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Constraint:
    """One requirement of a backend, with what SGLang says when it is not met."""

    kind: str
    phase: str
    source: str
    slots: tuple[str, ...] = _SLOTS
    fatal: bool = True
    message: str | None = None
    note: str | None = None
    archs: tuple[str, ...] = ()
    sms: Ranges = ()
    allowed: tuple[str, ...] = ()
    denied: tuple[str, ...] = ()
    platform: str | None = None


@dataclass(frozen=True, slots=True)
class Alias:
    """A deprecated backend name and what SGLang turns it into."""

    canonical: str
    message: str
    source: str
    canonical_prefill: str | None = None
    forces_kv_cache_dtype: str | None = None
    forces_slots: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Backend:
    """One backend name SGLang accepts, and its constraints in SGLang's order."""

    name: str
    summary: str
    platform: str
    constraints: tuple[Constraint, ...]
    models: str | None = None
    fill_prefill: str | None = None
    alias: Alias | None = None


@dataclass(frozen=True, slots=True)
class Preference:
    """Ordered replacement candidates for some archs on some GPUs."""

    archs: tuple[str, ...]
    sms_mode: Literal["ranges", "any", "unknown"]
    sms: Ranges
    candidates: tuple[str, ...]
    why: str


@dataclass(frozen=True, slots=True)
class CompatTable:
    """configs/backends.toml, validated."""

    sglang_version: str
    sources: tuple[str, ...]
    backends: tuple[Backend, ...]
    preferences: tuple[Preference, ...]
    ssm_skips_phases: tuple[str, ...]
    unknown_message: str
    unknown_source: str
    unknown_draft_message: str
    unknown_draft_source: str

    @property
    def names(self) -> tuple[str, ...]:
        """Every backend name, in table order."""
        return tuple(b.name for b in self.backends)

    def backend(self, name: str) -> Backend | None:
        """The backend called `name`, or None."""
        return next((b for b in self.backends if b.name == name), None)


# ------------------------------------------------------------------ parsing


class _Reader:
    """Typed access to the TOML tree; every error names the file and the dotted key."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.path, key, problem)

    def value(self, t: dict[str, Any], key: str, at: str, kind: type, required: bool) -> Any:
        where = f"{at}.{key}" if at else key
        if key not in t:
            if required:
                raise self.fail(where, "missing")
            return None
        v = t[key]
        # bool is an int in Python; an SM of `true` is a typo, not 1.
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise self.fail(where, f"expected {kind.__name__}, got {type(v).__name__}")
        return v

    def text(self, t: dict[str, Any], key: str, at: str, required: bool = True) -> str | None:
        return self.value(t, key, at, str, required)  # type: ignore[no-any-return]

    def must(self, t: dict[str, Any], key: str, at: str) -> str:
        v = self.value(t, key, at, str, True)
        assert isinstance(v, str)  # noqa: S101 -- required=True never returns None
        return v

    def texts(
        self,
        t: dict[str, Any],
        key: str,
        at: str,
        choices: tuple[str, ...] | None = None,
        required: bool = False,
    ) -> tuple[str, ...]:
        items = self.value(t, key, at, list, required) or []
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.fail(f"{at}.{key}[{i}]", f"expected str, got {type(item).__name__}")
            if choices is not None and item not in choices:
                raise self.fail(f"{at}.{key}[{i}]", f"{item!r} is not one of {choices}")
        return tuple(items)

    def choice(self, t: dict[str, Any], key: str, at: str, choices: tuple[str, ...]) -> str:
        v = self.must(t, key, at)
        if v not in choices:
            raise self.fail(f"{at}.{key}", f"{v!r} is not one of {choices}")
        return v

    def ranges(self, items: Any, at: str) -> Ranges:
        if not isinstance(items, list) or not items:
            raise self.fail(at, "expected a non-empty list of [low, high] SM pairs")
        out = []
        for i, pair in enumerate(items):
            ok = (
                isinstance(pair, list)
                and len(pair) == 2
                and all(isinstance(n, int) and not isinstance(n, bool) for n in pair)
            )
            if not ok or pair[0] > pair[1]:
                raise self.fail(f"{at}[{i}]", "expected [low, high] integers with low <= high")
            out.append((pair[0], pair[1]))
        return tuple(out)


def _constraint(r: _Reader, t: Any, at: str) -> Constraint:
    if not isinstance(t, dict):
        raise r.fail(at, "expected a table")
    kind = r.choice(t, "kind", at, _KINDS)
    c = Constraint(
        kind=kind,
        phase=r.choice(t, "phase", at, tuple(_PHASE_ORDER)),
        source=r.must(t, "source", at),
        slots=r.texts(t, "slots", at, _SLOTS) or _SLOTS,
        fatal=r.value(t, "fatal", at, bool, False) is not False,
        message=r.text(t, "message", at, False),
        note=r.text(t, "note", at, False),
        archs=r.texts(t, "archs", at, ARCHS, required=kind == "arch"),
        sms=r.ranges(t["sms"], f"{at}.sms") if "sms" in t else (),
        allowed=r.texts(t, "allowed", at),
        denied=r.texts(t, "denied", at),
        platform=r.choice(t, "platform", at, _PLATFORMS) if kind == "platform" else None,
    )
    if kind == "gpu" and not c.sms:
        raise r.fail(f"{at}.sms", "missing")
    if kind == "kv_cache_dtype" and not (c.allowed or c.denied):
        raise r.fail(f"{at}.allowed", "missing (or denied)")
    return c


def _backend(r: _Reader, name: str, t: Any) -> Backend:
    at = f"backends.{name}"
    if not isinstance(t, dict):
        raise r.fail(at, "expected a table")
    rules = r.value(t, "constraints", at, list, True)
    alias = None
    if "alias_of" in t:
        alias = Alias(
            canonical=r.must(t, "alias_of", at),
            message=r.must(t, "deprecated_message", at),
            source=r.must(t, "deprecated_source", at),
            canonical_prefill=r.text(t, "alias_of_prefill", at, False),
            forces_kv_cache_dtype=r.text(t, "forces_kv_cache_dtype", at, False),
            forces_slots=r.texts(t, "forces_slots", at, _SLOTS),
        )
    return Backend(
        name=name,
        summary=r.must(t, "summary", at),
        platform=r.choice(t, "platform", at, _PLATFORMS),
        constraints=tuple(_constraint(r, c, f"{at}.constraints[{i}]") for i, c in enumerate(rules)),
        models=r.text(t, "models", at, False),
        fill_prefill=r.text(t, "fill_prefill", at, False),
        alias=alias,
    )


def _preference_entry(r: _Reader, t: Any, at: str) -> Preference:
    if not isinstance(t, dict):
        raise r.fail(at, "expected a table")
    if "sms" not in t:
        raise r.fail(f"{at}.sms", "missing")
    raw = t["sms"]
    mode: Literal["ranges", "any", "unknown"] = "ranges"
    sms: Ranges = ()
    if raw in ("any", "unknown"):
        mode = raw
    else:
        sms = r.ranges(raw, f"{at}.sms")
    return Preference(
        archs=r.texts(t, "archs", at, ARCHS, required=True),
        sms_mode=mode,
        sms=sms,
        candidates=r.texts(t, "candidates", at, required=True),
        why=r.must(t, "why", at),
    )


def _cross_check(r: _Reader, table: CompatTable) -> None:
    """Names the table refers to must be backends of the same table."""
    names = set(table.names)
    for b in table.backends:
        at = f"backends.{b.name}"
        if b.fill_prefill is not None and b.fill_prefill not in names:
            raise r.fail(f"{at}.fill_prefill", f"{b.fill_prefill!r} is not a backend")
        if b.alias is None:
            continue
        for key, target in (
            ("alias_of", b.alias.canonical),
            ("alias_of_prefill", b.alias.canonical_prefill),
        ):
            if target is None:
                continue
            real = table.backend(target)
            if real is None or real.alias is not None:
                raise r.fail(f"{at}.{key}", f"{target!r} is not a backend (nor an alias)")
    for i, pref in enumerate(table.preferences):
        for name in pref.candidates:
            if name not in names:
                raise r.fail(f"rewrite_preference[{i}].candidates", f"{name!r} is not a backend")


def parse_table(text: str, path: str) -> CompatTable:
    """Parse and validate the backend table; errors name `path` and the dotted key."""
    r = _Reader(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise r.fail("", f"not valid TOML: {exc}") from exc
    meta = r.value(doc, "meta", "", dict, True)
    unknown = r.value(meta, "unknown_backend", "meta", dict, True)
    backends = r.value(doc, "backends", "", dict, True)
    prefs = r.value(doc, "rewrite_preference", "", list, True)
    table = CompatTable(
        sglang_version=r.must(meta, "sglang_version", "meta"),
        sources=r.texts(meta, "sources", "meta", required=True),
        backends=tuple(_backend(r, name, t) for name, t in backends.items()),
        preferences=tuple(
            _preference_entry(r, t, f"rewrite_preference[{i}]") for i, t in enumerate(prefs)
        ),
        ssm_skips_phases=r.texts(meta, "ssm_skips_phases", "meta", tuple(_PHASE_ORDER)),
        unknown_message=r.must(unknown, "message", "meta.unknown_backend"),
        unknown_source=r.must(unknown, "source", "meta.unknown_backend"),
        unknown_draft_message=r.must(unknown, "draft_message", "meta.unknown_backend"),
        unknown_draft_source=r.must(unknown, "draft_source", "meta.unknown_backend"),
    )
    _cross_check(r, table)
    return table


def load_default_table() -> CompatTable:
    """The table shipped in configs/backends.toml (reads that one file)."""
    path = config_path("backends.toml")
    return parse_table(path.read_text(encoding="utf-8"), str(path))


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
) -> str | None:
    """The reason `rule` fails for these facts, or None when it holds or cannot be judged."""
    name = backend.name
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
    for rule in backend.constraints:
        if slot not in rule.slots or rule.kind in found:
            continue  # SGLang stops at the first failure of each check
        if arch == "ssm" and rule.phase in table.ssm_skips_phases:
            continue  # a pure SSM model never builds the attention backend
        reason = _violation(backend, rule, slot, arch=arch, sm=sm, kv=kv)
        if reason is not None:
            found[rule.kind] = (rule, reason)
    # Argument checks run in the launcher before any backend is built: list what SGLang
    # would hit first, first.
    ordered = sorted(found.values(), key=lambda item: _PHASE_ORDER[item[0].phase])
    return [
        Problem(
            flag=flag,
            value=value,
            kind=rule.kind,  # type: ignore[arg-type]  # validated by the table parser
            reason=reason,
            sglang_message=_fill(
                rule.message, value=value, sm=sm, kv_cache_dtype=kv, fallback=_DRAFT_FALLBACK
            ),
            source=f"{rule.source} ({table.sglang_version})" if rule.source else None,
            fatal=rule.fatal,
        )
        for rule, reason in ordered
        if reason
    ]


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
) -> tuple[Problem, ...]:
    """Every problem SGLang would have with `flag value`, the ones it meets first first.

    `arch` is the attention arch of the model the flag serves (the draft model's for the
    draft flag); "unknown" skips the arch checks. `sm` None skips the GPU and platform
    checks; 0 means the host has no NVIDIA GPU (SGLang's own convention).
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
    problems += _constraint_problems(table, backend, flag, value, arch=arch, sm=sm, kv=kv)
    return tuple(problems)


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
