"""The backend compatibility table (configs/backends.toml) as frozen values, and its parser.

Checking a flag against it is `preflight/compat.py`; this module only reads and validates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from sglang_guard.common.record import record
from sglang_guard.config.tomlread import Table, is_kind
from sglang_guard.resources import config_path

# When SGLang meets each check: argument resolution, backend construction in the scheduler,
# the EAGLE draft worker, or the first kernel run.
PHASE_ORDER = {"args": 0, "build": 1, "worker": 2, "kernel": 3}


# ------------------------------------------------------------------ the table as values

ARCHS: tuple[str, ...] = ("mla", "mha", "ssm", "unknown")
_SLOTS = ("attention", "prefill", "decode", "draft")
_KINDS = ("arch", "gpu", "role", "platform", "kv_cache_dtype", "model_field", "model_arch")
_PLATFORMS = ("any", "cuda", "rocm", "npu", "cpu", "xpu")
Ranges = tuple[tuple[int, int], ...]


@record
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
    field: str | None = None  # model_field: the config.json field the model must have
    # model_arch: the config.json architectures SGLang builds the backend's state for (one of
    # them must be the model's)
    architectures: tuple[str, ...] = ()
    # The releases whose code behaves so (PEP 440; tools/constraint_ranges.py): where the
    # constraint cites `evidence` (the code that makes the combination fail), the releases
    # whose source holds it; else the releases whose source holds the message.
    sglang: str = ""
    # The releases whose source holds `message` (log matching, the text a finding quotes);
    # "" when it is `sglang`.
    said: str = ""
    # True on a release outside `sglang` that has no newer form of the check: what it does
    # is not known, so the check warns (never drops, rewrites or refuses).
    unconfirmed: bool = False
    key: str = ""  # "backend[index]" in configs/backends.toml (the evidence lines' key)
    # The code texts its evidence has (every one must be in a release's source), and whether
    # it also names text the source must lack (which a joined source cannot confirm).
    evidence: tuple[str, ...] = ()
    evidence_lacks: bool = False
    message_by: str | None = None  # "python" | "kernel": not SGLang's own text


@record
class Alias:
    """A deprecated backend name and what SGLang turns it into."""

    canonical: str
    message: str
    source: str
    canonical_prefill: str | None = None
    forces_kv_cache_dtype: str | None = None
    forces_slots: tuple[str, ...] = ()


@record
class Backend:
    """One backend name SGLang accepts, and its constraints in SGLang's order."""

    name: str
    summary: str
    platform: str
    constraints: tuple[Constraint, ...]
    models: str | None = None
    fill_prefill: str | None = None
    alias: Alias | None = None
    sglang: str = ""  # the releases this entry is for ("": every release that has the name)


@record
class ModelList:
    """A model whose SGLang argument phase takes only the listed backends (per release)."""

    architecture: str
    message: str
    allowed: tuple[str, ...] = ()
    source: str = ""
    slots: tuple[str, ...] = ()  # the flags SGLang checks against the list


@record
class Kv4:
    """SGLang's FP4 KV cache checks (handle_kv4_compatibility) as one release has them."""

    sm_message: str
    sm_dtype: str
    sms: Ranges
    messages: tuple[tuple[str, str], ...]  # (arch, message template)
    dtypes: tuple[str, ...] = ()  # the KV dtypes the checks are for in the release
    sm_source: str | None = None  # None: the release has no SM check
    lists: tuple[tuple[str, tuple[str, ...], str], ...] = ()  # (arch, backends, source)
    # NVFP4 prefill resolution (0.5.21 on): message templates from the spec, and per
    # release the prefill backend of each dequant dtype and the file:line of each refusal.
    prefill_messages: tuple[tuple[str, str], ...] = ()  # (neither | sm100 | decode, text)
    prefill_backends: tuple[tuple[str, str], ...] = ()  # (dequant dtype, prefill backend)
    prefill_sources: tuple[tuple[str, str], ...] = ()  # (neither | sm100 | decode, cite)


@record
class KvSm:
    """A --kv-cache-dtype value SGLang's argument phase refuses outside some SMs."""

    dtype: str
    sms: Ranges
    message: str
    note: str | None = None
    # For a release: the file:line of its check; None where its parser takes the dtype and
    # its source has no such check (the guard warns only). As written: None.
    source: str | None = None


@record
class Preference:
    """Ordered replacement candidates for some archs on some GPUs."""

    archs: tuple[str, ...]
    sms_mode: Literal["ranges", "any", "unknown"]
    sms: Ranges
    candidates: tuple[str, ...]
    why: str


@record
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
    # As written: the models with allow-lists; for a release, each with that release's list
    # (configs/sglang/model-backends.json), and only where that release has one.
    model_lists: tuple[ModelList, ...] = ()
    kv4: Kv4 | None = None  # as written: the spec; for a release: its checks (or None)
    # As written: every [[kv_sm]] entry; for a release: those for the dtypes its parser
    # takes, each with the release's line (configs/sglang/kv-sm.json).
    kv_sm: tuple[KvSm, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every backend name, in table order."""
        return tuple(b.name for b in self.backends)

    def backend(self, name: str) -> Backend | None:
        """The backend called `name`, or None."""
        return next((b for b in self.backends if b.name == name), None)

    def for_release(self, release: str | None, names: tuple[str, ...] | None) -> CompatTable:
        """This table as it holds for SGLang `release`, whose parser accepts `names`.

        Only entries and constraints whose `sglang` range holds the release stay: a check
        acts only on a release whose own source holds it. A name that release accepts but
        the table has no entry for gets one without constraints (nothing known to check).
        None (release unknown): the table as written.
        """
        if release is None:
            return self
        version = Version(release)
        lines = evidence_lines()
        keep = [replace(b, constraints=_constraints_for(b.constraints, release, version, lines))
                for b in self.backends if _holds(b.sglang, version)]
        if names is not None:
            known = {b.name for b in keep}
            keep = [b for b in keep if b.name in names] + [
                Backend(n, f"accepted by SGLang {release}; no constraint known", "any", ())
                for n in names if n not in known]
            present = {b.name for b in keep}
            keep = [b if b.alias is None or b.alias.canonical in present
                    else replace(b, alias=None) for b in keep]
        prefs = tuple(replace(p, candidates=tuple(c for c in p.candidates
                                                  if any(b.name == c for b in keep)))
                      for p in self.preferences)
        lists = model_backend_lists()
        models = tuple(
            replace(m, allowed=tuple(run[2]), source=run[3], slots=tuple(run[4]))
            for m in self.model_lists
            for run in lists.get(m.architecture, ())
            if _version(run[0]) <= version <= _version(run[1]))
        return replace(self, sglang_version=release, backends=tuple(keep), preferences=prefs,
                       model_lists=models, kv4=_kv4_for(self.kv4, version),
                       kv_sm=_kv_sm_for(self.kv_sm, version))


# The table's few range strings, each parsed once a process (~340 parses a `check`).
@cache
def _version(text: str) -> Version:
    return Version(text)


@cache
def _specifiers(spec: str) -> SpecifierSet:
    return SpecifierSet(spec)


def _holds(spec: str, version: Version) -> bool:
    return not spec or _specifiers(spec).contains(version, prereleases=True)


def _same_check(a: Constraint, b: Constraint) -> bool:
    """Two forms of one check (a release's rewording or widening of the other)."""
    return (a.kind == b.kind and bool(set(a.slots) & set(b.slots))
            and (a.kind != "gpu" or set(a.archs) == set(b.archs)))


def _constraints_for(rules: tuple[Constraint, ...], release: str, version: Version,
                     lines: dict[str, list[list[str]]]) -> tuple[Constraint, ...]:
    """The constraints as they hold for `release`.

    In its range a constraint acts, citing the release's own line where the evidence lines
    know it, and quoting its message only where that release's source holds it. Outside its
    range, a newer (or older) form of the same check that holds for the release replaces it;
    with none, the release's behaviour is not known and the check warns, saying so.
    """
    out = []
    for c in rules:
        if _holds(c.sglang, version):
            source = _cite(lines.get(c.key, ()), version) or c.source
            said = c.message if c.message and _holds(c.said, version) else None
            out.append(replace(c, source=source, message=said))
        elif not any(_same_check(c, o) and _holds(o.sglang, version) for o in rules if o is not c):
            out.append(replace(c, fatal=False, unconfirmed=True, message=None))
    return tuple(out)


def _cite(runs: Iterable[list[str]], version: Version) -> str | None:
    """The file:line of the run [first, last, cite] that holds `version`."""
    for first, last, cite in runs:
        if _version(first) <= version <= _version(last):
            return cite
    return None


def _kv4_for(spec: Kv4 | None, version: Version) -> Kv4 | None:
    """The release's KV4 checks (configs/sglang/kv4.json), or None where it has none."""
    if spec is None:
        return None
    for first, last, found in _json_config("kv4.json", []):
        if _version(first) <= version <= _version(last):
            prefill = found.get("nvfp4_prefill") or {}
            return replace(spec, dtypes=tuple(found["dtypes"]), sm_source=found.get("sm"),
                           lists=tuple((arch, tuple(names), src)
                                       for arch, (names, src) in found["lists"].items()),
                           prefill_backends=tuple(prefill.get("backends", {}).items()),
                           prefill_sources=tuple((k, prefill[k]) for k in
                                                 ("neither", "sm100", "decode") if k in prefill))
    return None


def _kv_sm_for(specs: tuple[KvSm, ...], version: Version) -> tuple[KvSm, ...]:
    """The KV dtype SM checks of the release (configs/sglang/kv-sm.json)."""
    runs = _json_config("kv-sm.json", {})
    out = []
    for spec in specs:
        for first, last, cite in runs.get(spec.dtype, ()):
            if _version(first) <= version <= _version(last):
                out.append(replace(spec, source=cite))
    return tuple(out)


_JSON: dict[str, Any] = {}


def _json_config(name: str, empty: Any) -> Any:
    """configs/sglang/NAME (tools/constraint_ranges.py), read once; `empty` when absent."""
    if name not in _JSON:
        path = config_path("sglang", name)
        _JSON[name] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else empty
    return _JSON[name]


_LISTS: list[dict[str, list[list[Any]]]] = []


def model_backend_lists() -> dict[str, list[list[Any]]]:
    """configs/sglang/model-backends.json (tools/constraint_ranges.py): per architecture,
    runs of releases [first, last, [backend, ...], "file:line", [slot, ...]] alike."""
    if not _LISTS:
        path = config_path("sglang", "model-backends.json")
        _LISTS.append(json.loads(path.read_text(encoding="utf-8")) if path.exists() else {})
    return _LISTS[0]


_LINES: list[dict[str, list[list[str]]]] = []


def evidence_lines() -> dict[str, list[list[str]]]:
    """configs/sglang/constraint-lines.json (tools/constraint_ranges.py): per constraint key,
    runs of releases [first, last, "file:line"] where its evidence is found."""
    if not _LINES:
        path = config_path("sglang", "constraint-lines.json")
        _LINES.append(json.loads(path.read_text(encoding="utf-8")) if path.exists() else {})
    return _LINES[0]


# ------------------------------------------------------------------ parsing


def _ranges(t: Table, key: str) -> Ranges:
    items = t.data[key]
    if not isinstance(items, list) or not items:
        raise t.fail(key, "expected a non-empty list of [low, high] SM pairs")
    out = []
    for i, pair in enumerate(items):
        ok = (
            isinstance(pair, list)
            and len(pair) == 2
            and all(is_kind(n, int) for n in pair)
        )
        if not ok or pair[0] > pair[1]:
            raise t.fail(f"{key}[{i}]", "expected [low, high] integers with low <= high")
        out.append((pair[0], pair[1]))
    return tuple(out)


def _constraint(t: Table, key: str) -> Constraint:
    kind = t.choice("kind", _KINDS)
    c = Constraint(
        kind=kind,
        phase=t.choice("phase", tuple(PHASE_ORDER)),
        source=t.must("source"),
        slots=t.strings("slots", choices=_SLOTS) or _SLOTS,
        fatal=t.get("fatal", bool) is not False,  # absent: fatal
        message=t.text("message"),
        note=t.text("note"),
        archs=t.strings("archs", choices=ARCHS, required=kind == "arch") or (),
        sms=_ranges(t, "sms") if "sms" in t.data else (),
        allowed=t.strings("allowed") or (),
        denied=t.strings("denied") or (),
        platform=t.choice("platform", _PLATFORMS) if kind == "platform" else None,
        field=t.must("field") if kind == "model_field" else None,
        architectures=t.strings("architectures", required=kind == "model_arch") or (),
        sglang=_specifier(t, "sglang"),
        said=_specifier(t, "said"),
        key=key,
        evidence=tuple(str(e["has"]) for e in t.data.get("evidence", []) if "has" in e),
        evidence_lacks=any("lacks" in e for e in t.data.get("evidence", [])),
        message_by=t.text("message_by"),
    )
    if kind == "gpu" and not c.sms:
        raise t.fail("sms", "missing")
    if kind == "kv_cache_dtype" and not (c.allowed or c.denied):
        raise t.fail("allowed", "missing (or denied)")
    return c


def _specifier(t: Table, key: str) -> str:
    spec = t.text(key) or ""
    try:
        _specifiers(spec)
    except InvalidSpecifier as exc:
        raise t.fail(key, f"not a version specifier: {exc}") from None
    return spec


def _backend(t: Table, name: str, key: str) -> Backend:
    rules = t.get("constraints", list, required=True)
    alias = None
    if "alias_of" in t.data:
        alias = Alias(
            canonical=t.must("alias_of"),
            message=t.must("deprecated_message"),
            source=t.must("deprecated_source"),
            canonical_prefill=t.text("alias_of_prefill"),
            forces_kv_cache_dtype=t.text("forces_kv_cache_dtype"),
            forces_slots=t.strings("forces_slots", choices=_SLOTS) or (),
        )
    return Backend(
        name=name,
        summary=t.must("summary"),
        platform=t.choice("platform", _PLATFORMS),
        constraints=tuple(_constraint(t.child(f"{t.at}.constraints[{i}]", c), f"{key}[{i}]")
                          for i, c in enumerate(rules)),
        models=t.text("models"),
        fill_prefill=t.text("fill_prefill"),
        alias=alias,
        sglang=_specifier(t, "sglang"),
    )


def _preference_entry(t: Table) -> Preference:
    if "sms" not in t.data:
        raise t.fail("sms", "missing")
    raw = t.data["sms"]
    mode: Literal["ranges", "any", "unknown"] = "ranges"
    sms: Ranges = ()
    if raw in ("any", "unknown"):
        mode = raw
    else:
        sms = _ranges(t, "sms")
    return Preference(
        archs=t.strings("archs", choices=ARCHS, required=True) or (),
        sms_mode=mode,
        sms=sms,
        candidates=t.strings("candidates", required=True) or (),
        why=t.must("why"),
    )


def _cross_check(root: Table, table: CompatTable) -> None:
    """Names the table refers to must be backends of the same table."""
    names = set(table.names)
    for b in table.backends:
        at = f"backends.{b.name}"
        if b.fill_prefill is not None and b.fill_prefill not in names:
            raise root.fail(f"{at}.fill_prefill", f"{b.fill_prefill!r} is not a backend")
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
                raise root.fail(f"{at}.{key}", f"{target!r} is not a backend (nor an alias)")
    for i, pref in enumerate(table.preferences):
        for name in pref.candidates:
            if name not in names:
                raise root.fail(f"rewrite_preference[{i}].candidates",
                                f"{name!r} is not a backend")


def parse_table(text: str, path: str, data: Mapping[str, Any] | None = None) -> CompatTable:
    """Parse and validate the backend table; errors name `path` and the dotted key. `data`:
    the TOML of `text` decoded already (config/shell/tablecache.py keeps it), validated the same."""
    root = Table.parse(text, path) if data is None else Table(path, "", data)
    meta = root.table("meta", required=True)
    unknown = meta.table("unknown_backend", required=True)
    backends = root.table("backends", required=True)
    prefs = root.get("rewrite_preference", list, required=True)
    lists = root.get("model_backends", list) or []
    kv4 = root.table("kv4") if "kv4" in root.data else None
    kv_sm = [root.child(f"kv_sm[{i}]", t) for i, t in enumerate(root.get("kv_sm", list) or [])]
    table = CompatTable(
        sglang_version=meta.must("sglang_version"),
        sources=meta.strings("sources", required=True) or (),
        # "name@0.5.22": another release's entry for the same name (see `sglang`).
        backends=tuple(_backend(root.child(f"backends.{key}", t), key.split("@", 1)[0], key)
                       for key, t in backends.data.items()),
        preferences=tuple(
            _preference_entry(root.child(f"rewrite_preference[{i}]", t))
            for i, t in enumerate(prefs)
        ),
        ssm_skips_phases=meta.strings("ssm_skips_phases", choices=tuple(PHASE_ORDER)) or (),
        unknown_message=unknown.must("message"),
        unknown_source=unknown.must("source"),
        unknown_draft_message=unknown.must("draft_message"),
        unknown_draft_source=unknown.must("draft_source"),
        model_lists=tuple(
            ModelList(architecture=m.must("architecture"), message=m.must("message"))
            for m in (root.child(f"model_backends[{i}]", t) for i, t in enumerate(lists))),
        kv4=None if kv4 is None else Kv4(
            sm_message=kv4.must("sm_message"), sm_dtype=kv4.must("sm_dtype"),
            sms=_ranges(kv4, "sms"),
            messages=(("mla", kv4.must("mla_message")), ("mha", kv4.must("mha_message"))),
            prefill_messages=tuple((k, kv4.must(f"prefill_{k}"))
                                   for k in ("neither", "sm100", "decode"))),
        kv_sm=tuple(KvSm(dtype=k.must("dtype"), sms=_ranges(k, "sms"), message=k.must("message"),
                         note=k.text("note")) for k in kv_sm),
    )
    _cross_check(root, table)
    return table


_RAW: list[CompatTable] = []


def load_raw_table(decode: Callable[[Path], Mapping[str, Any]] | None = None) -> CompatTable:
    """configs/backends.toml as written: every release's entries (read once per process).

    `decode`: how the TOML file becomes data (the shell's cached decoding); else tomllib.
    """
    if not _RAW:
        path = config_path("backends.toml")
        if decode is None:
            _RAW.append(parse_table(path.read_text(encoding="utf-8"), str(path)))
        else:
            _RAW.append(parse_table("", str(path), decode(path)))
    return _RAW[0]


def load_default_table() -> CompatTable:
    """The table shipped in configs/backends.toml, as it holds for the release it was read from."""
    table = load_raw_table()
    return table.for_release(table.sglang_version, None)


def confirmed_only(table: CompatTable, source: str | None) -> tuple[CompatTable, int, int]:
    """For a release without a table of its own: a check whose message its installed source
    (normalised, see sglang/msgsearch) does not hold may warn, never drop, rewrite or refuse.

    Returns the table and (confirmed, total) counts; `source` None confirms nothing.
    """
    from sglang_guard.sglang.msgsearch import holds  # noqa: PLC0415

    total = confirmed = 0
    backends = []
    for b in table.backends:
        kept = []
        for c in b.constraints:
            total += 1
            said = c.message is not None and c.message_by is None
            # The code that makes the line fail is still there (and nothing is asked absent).
            coded = bool(c.evidence) and not c.evidence_lacks
            ok = source is not None and (
                (said and holds(source, c.message or ""))
                or (coded and all(e in source for e in c.evidence)))
            confirmed += ok
            kept.append(c if ok else replace(c, fatal=False))
        backends.append(replace(b, constraints=tuple(kept)))
    # A KV dtype SM check whose message the source lacks warns only (source None).
    kv_sm = tuple(k if source is not None and holds(source, k.message) else replace(k, source=None)
                  for k in table.kv_sm)
    return replace(table, backends=tuple(backends), kv_sm=kv_sm), confirmed, total
