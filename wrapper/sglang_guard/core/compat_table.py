"""The backend compatibility table (configs/backends.toml) as frozen values, and its parser.

Checking a flag against it is `core/compat.py`; this module only reads and validates.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any, Literal

from sglang_guard.errors import ConfigError
from sglang_guard.resources import config_path

# When SGLang meets each check: argument resolution, backend construction in the scheduler,
# the EAGLE draft worker, or the first kernel run.
PHASE_ORDER = {"args": 0, "build": 1, "worker": 2, "kernel": 3}


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
        phase=r.choice(t, "phase", at, tuple(PHASE_ORDER)),
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
        ssm_skips_phases=r.texts(meta, "ssm_skips_phases", "meta", tuple(PHASE_ORDER)),
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
