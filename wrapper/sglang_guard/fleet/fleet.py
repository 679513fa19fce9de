"""Fleet memory, decided without I/O: what a key is, what an entry holds, what may be applied.

A key is a digest of everything that decides whether a learned fix applies: the SGLang
release, the model's (and draft model's) config.json digest, the GPU (name and SM), the
command line with what differs between hosts (hosts, ports, ranks, log and dump paths,
secrets) normalised away, and the rule packs' digest. An entry is what one guard learned for
a key: the edits that took its command line to ready (as the journal writes them), the rules
and fatal lines that led to them, the launches it cost, where it was learned, and how many
guards confirmed it since; or, `known_bad`, a fix that was tried and failed.

Nothing read from a store is trusted: `decode_entry` checks size and schema, `problems`
checks every edit against the running release's option table and the deny list
(rules/packcheck.py) before `apply_entry` changes anything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, field, replace
from typing import Any

from sglang_guard.common.outcomes import FixKind
from sglang_guard.common.record import record
from sglang_guard.rules.packcheck import INTERNAL_PORTS, is_denied, resolve_flag
from sglang_guard.rules.rulepack import RulePack
from sglang_guard.sglang.argv import CONFIG_FLAG, CommandLine, parse_command_line
from sglang_guard.sglang.edits import Edit, apply_edits
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.redact import is_secret_dest, redact_text

SCHEMA = 1
MAX_ENTRY_BYTES = 16 * 1024  # a store value above this is refused unread
MAX_EDITS = 16
MAX_LINES = 8
MAX_TEXT = 500  # a fatal line or an origin field, at most
STATUSES = ("proven", "known_bad")
EDIT_ACTIONS = (FixKind.DROP_FLAG, FixKind.SET_FLAG)
KEY_CHARS = frozenset("0123456789abcdef")

# Words of a flag's name that make its value a per-host fact: where it listens or dials,
# which rank it is. Such flags are left out of the key and never taken from an entry.
_PLACE_WORDS = frozenset({"host", "port", "ports", "addr", "address", "ip", "url", "urls",
                          "endpoint", "endpoints", "socket", "rank"})
# A flag with one of these words and one of _PATH_WORDS is where logs, dumps or metrics go.
_LOG_WORDS = frozenset({"log", "logs", "dump", "crash", "metrics", "storage", "download",
                        "requests", "trace", "traces"})
_PATH_WORDS = frozenset({"dir", "folder", "file", "path", "target"})
_MODEL_DESTS = ("model_path", "speculative_draft_model_path")


def per_host(flag: str, dest: str = "") -> bool:
    """True when `flag`'s value differs between hosts of one fleet by nature."""
    words = set(flag.lstrip("-").split("-"))
    return bool(words & _PLACE_WORDS) or bool(words & _LOG_WORDS and words & _PATH_WORDS) \
        or flag == CONFIG_FLAG or is_secret_dest(dest or flag.lstrip("-").replace("-", "_"))


@record
class FleetKey:
    """What decides whether a learned fix applies; equal keys, equal decisions."""

    sglang: str | None
    model_config: str | None  # sha256 of config.json (None: could not be read)
    draft_config: str | None
    gpu_name: str | None
    gpu_sm: int | None
    flags: tuple[tuple[str, str | None], ...]  # normalised effective flags, sorted
    rule_packs: str  # digest of the rule packs in force

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {**asdict(self), "flags": [list(f) for f in self.flags]}

    def digest(self) -> str:
        """The key's name in a store: sha256 hex of its canonical JSON."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def normalised_flags(cl: CommandLine, model_known: Mapping[str, bool] | None = None
                     ) -> tuple[tuple[str, str | None], ...]:
    """The effective flags without per-host ones; a secret counts as set, never its value;
    a model path whose config.json digest is in the key counts by that digest alone."""
    known = model_known or {}
    out: dict[str, str | None] = {}
    for occ in cl.occurrences:
        spec = occ.spec
        if spec is None:
            continue
        if is_secret_dest(spec.dest):
            out[spec.canonical] = "<set>"
            continue
        if per_host(spec.canonical, spec.dest) or known.get(spec.dest):
            continue
        out[spec.canonical] = occ.value
    return tuple(sorted(out.items()))


def pack_digest(packs: Sequence[RulePack]) -> str:
    """sha256 over the rule packs' content (name, release range, every rule)."""
    h = hashlib.sha256()
    for pack in packs:
        h.update(repr((pack.name, pack.sglang_versions, pack.rules)).encode())
    return h.hexdigest()


def make_key(cl: CommandLine, *, sglang: str | None, model_config: str | None,
             draft_config: str | None, gpu_name: str | None, gpu_sm: int | None,
             packs: Sequence[RulePack]) -> FleetKey:
    """The key of the launch `cl` on this host."""
    known = {"model_path": model_config is not None,
             "speculative_draft_model_path": draft_config is not None}
    return FleetKey(sglang, model_config, draft_config, gpu_name, gpu_sm,
                    normalised_flags(cl, known), pack_digest(packs))


# -- entries --------------------------------------------------------------------------------


@record
class FleetEdit:
    """One change of the command line, as the journal writes a remediation."""

    flag: str
    action: FixKind  # drop_flag | set_flag (EDIT_ACTIONS)
    old_value: str | None = None
    new_value: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return asdict(self)


@record
class Origin:
    """Where and when an entry was learned (no secrets: a guard id and a time)."""

    guard: str
    learned_at: str  # ISO 8601, UTC
    sglang: str | None = None
    gpu: str | None = None


@record
class Entry:
    """What one guard learned for a key."""

    key: str
    status: str  # proven | known_bad
    edits: tuple[FleetEdit, ...]
    rules: tuple[str, ...]
    lines: tuple[str, ...]
    launches: int  # the launches the fix cost its learner
    origin: Origin
    confirmations: int = 0
    failed_by: tuple[str, ...] = field(default=())  # guards that failed with it (known_bad)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping (the store's value)."""
        return {"schema": SCHEMA, "key": self.key, "status": self.status,
                "edits": [e.to_json() for e in self.edits], "rules": list(self.rules),
                "lines": list(self.lines), "launches": self.launches,
                "origin": asdict(self.origin), "confirmations": self.confirmations,
                "failed_by": list(self.failed_by)}

    def encode(self) -> bytes:
        """The store's value; ValueError when it would be above MAX_ENTRY_BYTES."""
        data = json.dumps(self.to_json(), sort_keys=True).encode()
        if len(data) > MAX_ENTRY_BYTES:
            raise ValueError(f"entry is {len(data)} bytes (limit {MAX_ENTRY_BYTES})")
        return data

    def confirmed(self) -> Entry:
        """One more guard reached ready with it."""
        return replace(self, confirmations=self.confirmations + 1)

    def known_bad(self, guard: str) -> Entry:
        """A guard failed with it: nobody should try it again for this key."""
        failed = tuple(dict.fromkeys((*self.failed_by, _text(guard))))[-MAX_LINES:]
        return replace(self, status="known_bad", failed_by=failed)


def _text(value: object, limit: int = MAX_TEXT) -> str:
    return redact_text(str(value))[:limit]


def _opt_str(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name}: expected a string or null")
    return value


def _strings(data: Mapping[str, Any], name: str, limit: int) -> tuple[str, ...]:
    value = data.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name}: expected a list of strings")
    if len(value) > limit:
        raise ValueError(f"{name}: more than {limit} items")
    return tuple(_text(v) for v in value)


def _count(data: Mapping[str, Any], name: str) -> int:
    value = data.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
        raise ValueError(f"{name}: expected a count")
    return value


def _edit(raw: object) -> FleetEdit:
    if not isinstance(raw, dict) or set(raw) - {"flag", "action", "old_value", "new_value"}:
        raise ValueError("edits: each edit is {flag, action, old_value, new_value}")
    flag, action = raw.get("flag"), raw.get("action")
    if not isinstance(flag, str) or not flag.startswith("--") or len(flag) > 100:
        raise ValueError(f"edits: bad flag {flag!r}")
    if action not in EDIT_ACTIONS:
        raise ValueError(f"edits: action {action!r} is not one of {', '.join(EDIT_ACTIONS)}")
    old, new = _opt_str(raw, "old_value"), _opt_str(raw, "new_value")
    if action == FixKind.DROP_FLAG and new is not None:
        raise ValueError(f"edits: drop_flag {flag} with a new value")
    if any(v is not None and len(v) > MAX_TEXT for v in (old, new)):
        raise ValueError(f"edits: {flag}: value too long")
    return FleetEdit(flag, FixKind(action), old, new)


def decode_entry(raw: bytes, key: str) -> Entry:
    """The entry a store holds under `key`; ValueError names what is wrong with it."""
    if len(raw) > MAX_ENTRY_BYTES:
        raise ValueError(f"entry is {len(raw)} bytes (limit {MAX_ENTRY_BYTES})")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"not a fleet entry of schema {SCHEMA}")
    if data.get("key") != key:
        raise ValueError("the entry names another key")
    if data.get("status") not in STATUSES:
        raise ValueError(f"status {data.get('status')!r} is not one of {', '.join(STATUSES)}")
    edits = data.get("edits")
    if not isinstance(edits, list) or not 0 < len(edits) <= MAX_EDITS:
        raise ValueError(f"edits: expected 1 to {MAX_EDITS} edits")
    origin = data.get("origin")
    if not isinstance(origin, dict) or not isinstance(origin.get("guard"), str) \
            or not isinstance(origin.get("learned_at"), str):
        raise ValueError("origin: expected {guard, learned_at, ...}")
    gpu_sm = origin.get("gpu")
    return Entry(
        key=key, status=str(data["status"]), edits=tuple(_edit(e) for e in edits),
        rules=_strings(data, "rules", MAX_EDITS), lines=_strings(data, "lines", MAX_LINES),
        launches=_count(data, "launches"),
        origin=Origin(_text(origin["guard"]), _text(origin["learned_at"], 40),
                      _opt_str(origin, "sglang"), None if gpu_sm is None else _text(gpu_sm)),
        confirmations=_count(data, "confirmations"),
        failed_by=_strings(data, "failed_by", MAX_LINES))


def valid_key(key: str) -> bool:
    """A store key is a sha256 hex digest (nothing else is read or written)."""
    return len(key) == 64 and set(key) <= KEY_CHARS


# -- learning and applying ------------------------------------------------------------------


def learned_edits(first: CommandLine, ready: CommandLine) -> tuple[FleetEdit, ...]:
    """The edits that took `first` to `ready`, per flag; per-host flags (a picked free port,
    a log path) are this host's own and left out."""
    before, after = first.effective(), ready.effective()
    out: list[FleetEdit] = []
    for flag, value in before.items():
        if flag not in after and not per_host(flag):
            out.append(FleetEdit(flag, FixKind.DROP_FLAG, value, None))
    for flag, value in after.items():
        if per_host(flag):
            continue
        if flag not in before or before[flag] != value:
            out.append(FleetEdit(flag, FixKind.SET_FLAG, before.get(flag), value))
    return tuple(out)


def problems(entry: Entry, table: OptionTable, allow: Collection[str] = ()) -> list[str]:
    """Why `entry` must not be applied on this release (empty: it may)."""
    out: list[str] = []
    for edit in entry.edits:
        spec, problem = resolve_flag(table, edit.flag)
        if spec is None:
            out.append(problem or f"{edit.flag}: unknown")
            continue
        if is_denied(edit.flag) and edit.flag not in allow:
            out.append(f"{edit.flag} is on the deny list: no fleet entry may change it")
        elif per_host(edit.flag, spec.dest) or edit.flag in INTERNAL_PORTS:
            out.append(f"{edit.flag} is a per-host flag: no entry may change it")
        if edit.action != FixKind.SET_FLAG:
            continue
        if not spec.takes_value and edit.new_value is not None:
            out.append(f"{edit.flag} takes no value")
        elif spec.takes_value and edit.new_value is None:
            out.append(f"{edit.flag} needs a value")
        elif spec.choices is not None and edit.new_value is not None \
                and edit.new_value not in spec.choices:
            out.append(f"{edit.new_value!r} is not a choice of {edit.flag} in SGLang "
                       f"{table.sglang_version}")
    return out


def apply_entry(cl: CommandLine, entry: Entry, table: OptionTable, derived_dir: str
                ) -> tuple[CommandLine | None, str | None]:
    """`cl` with the entry's edits (None and why when they change nothing or add a problem)."""
    edits = []
    for e in entry.edits:
        dest = table.spec(e.flag).dest
        edits.append(Edit(dest, "drop") if e.action == FixKind.DROP_FLAG else
                     Edit(dest, "set", e.new_value))
    result = apply_edits(cl, table, edits, derived_dir)
    yaml_data = result.derived_yaml if result.derived_yaml is not None else cl.yaml_data
    new = parse_command_line(result.argv, table, yaml_data)
    if new.argv == cl.argv and result.derived_yaml is None:
        return None, "its edits change nothing on this command line"
    old = {o.problem for o in cl.occurrences if o.problem}
    added = [o.problem for o in new.occurrences if o.problem and o.problem not in old]
    if added:
        return None, f"SGLang {table.sglang_version} would reject the result ({added[0]})"
    return new, None


def fatal_lines(lines: Sequence[str]) -> tuple[str, ...]:
    """The fatal lines an entry keeps: masked, bounded in length and number."""
    return tuple(dict.fromkeys(_text(line) for line in lines))[:MAX_LINES]
