"""Error-dataset records (schema v2) turned into rules: `sglang-guard rules import`, pure part.

A record describes one SGLang error: its message and an RE2-able `messagePattern`, the
exception class, where it is raised, and an `exampleFix` with a before and an after command
line. The pattern becomes the rule's (anchored to the class, so that only SGLang's own error
output matches); the action is read from the example: both command lines are parsed with
the release's option table and diffed. One flag removed, added or changed gives
`drop_flag`, `set_flag` or `rewrite_value`; anything else (a different model, a comment
only, several changes, a flag the release lacks, a deny-listed flag) gives an advice rule,
which changes nothing and shows the record's explanation and solutions.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import re2

from sglang_guard.common.outcomes import FixKind
from sglang_guard.common.record import record
from sglang_guard.errors import GuardError, InputError
from sglang_guard.rules.fixes import Literal
from sglang_guard.rules.packcheck import is_denied
from sglang_guard.rules.rulepack import Rule, compile_pattern
from sglang_guard.sglang.argv import CommandLine, parse_command_line
from sglang_guard.sglang.options import OptionTable

SCHEMA_VERSION = 2
_CLASS = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_MARK = re.compile(r"^\s*(?:#+|//)?\s*(before|after)\b", re.IGNORECASE)


@record
class Note:
    """Something the import reports about one record (`skipped`: it gave no rule)."""

    record: str
    problem: str
    skipped: bool = False


@record
class Imported:
    """The rules made from a dataset, what was said about its records, and its version."""

    rules: tuple[Rule, ...]
    notes: tuple[Note, ...]
    dataset_version: str | None
    records: int


@record
class Entry:
    """One line of the dataset: the record itself and where it was."""

    line_no: int
    record: Mapping[str, Any]
    dataset_version: str | None

    @property
    def id(self) -> str:
        """The record's id, or its line when it has none."""
        rid = self.record.get("id")
        return rid if isinstance(rid, str) and rid else f"line {self.line_no}"


# --- reading -------------------------------------------------------------------------------


def read_dataset(text: str, path: str) -> list[Entry]:
    """Every record of a JSONL dataset (the record under `record` or at the top level)."""
    entries = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}: line {n}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}: line {n}: expected a JSON object")
        record = obj.get("record", obj)
        if not isinstance(record, dict):
            raise InputError(f"{path}: line {n}: `record` is not an object")
        version = obj.get("datasetVersion")
        entries.append(Entry(n, record, version if isinstance(version, str) else None))
    if not entries:
        raise InputError(f"{path}: no records")
    for entry in entries:
        schema = entry.record.get("schemaVersion")
        if schema != SCHEMA_VERSION or isinstance(schema, bool):
            raise InputError(f"{path}: line {entry.line_no}: record {entry.id}: schemaVersion "
                             f"{schema!r} is not {SCHEMA_VERSION}, the only one this guard reads")
    return entries


def _text(record: Mapping[str, Any], key: str) -> str:
    value = record.get(key)
    if isinstance(value, list):
        return " ".join(str(v).strip() for v in value if isinstance(v, str | int | float))
    return value.strip() if isinstance(value, str) else ""


def _texts(record: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = record.get(key)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return ()
    return tuple(v.strip() for v in value if isinstance(v, str) and v.strip())


# --- the pattern ---------------------------------------------------------------------------


def build_pattern(record: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The rule's pattern (anchored to `errorClass`), or None and why not."""
    body = _text(record, "messagePattern")
    if not body:
        message = _text(record, "errorMessage")
        if not message:
            return None, "neither messagePattern nor errorMessage"
        body = re2.escape(message)
    try:
        compile_pattern(body)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        return None, f"messagePattern is not a valid RE2 pattern ({detail}); skipped"
    cls = _text(record, "errorClass")
    if not _CLASS.match(cls):
        return body, None
    inner = body[1:] if body.startswith("^") else body
    # (?:...) keeps a top-level `a|b` from escaping the anchor.
    anchored = rf"\b{re2.escape(cls)}: (?:{inner})"
    try:
        compile_pattern(anchored)
    except re2.error:
        return None, "messagePattern cannot be anchored to its errorClass; skipped"
    return anchored, None


# --- the action ----------------------------------------------------------------------------


def split_example(text: str) -> tuple[str, str] | None:
    """The before and after sections of an `exampleFix` (None without both markers)."""
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        mark = _MARK.match(line)
        if mark and (line.lstrip().startswith(("#", "//")) or line.rstrip().endswith(":")):
            current = mark.group(1).lower()
            sections.setdefault(current, [])
        elif current is not None:
            sections[current].append(line)
    if "before" not in sections or "after" not in sections:
        return None
    return "\n".join(sections["before"]), "\n".join(sections["after"])


def sglang_args(section: str) -> list[str]:
    """The SGLang arguments of a command section: comments and the launcher left out."""
    tokens = shlex.split(section.replace("\\\n", " "), comments=True)
    for i, tok in enumerate(tokens):
        if tok.endswith("sglang.launch_server") or (
                tok == "serve" and i > 0 and tokens[i - 1].endswith("sglang")):
            return tokens[i + 1:]
    start = next((i for i, tok in enumerate(tokens) if tok.startswith("-")), len(tokens))
    return tokens[start:]


@record
class ExampleFix:
    """What a record's example fix asks for; `action` advice with the reason when nothing."""

    action: FixKind
    flag: str | None = None
    values: tuple[str, ...] | None = None
    new_value: str | None = None
    why: str = ""


def _advice(why: str) -> ExampleFix:
    return ExampleFix(FixKind.ADVICE, why=why)


def _parse(args: list[str], table: OptionTable, which: str) -> CommandLine | ExampleFix:
    try:
        cl = parse_command_line(args, table)
    except GuardError as exc:
        return _advice(f"the example's {which} command cannot be read: {exc}")
    for occ in cl.occurrences:
        if (occ.problem and occ.problem.startswith("unrecognized")
                and occ.option.startswith("-")):
            return _advice(f"the example's {which} command names {occ.option}, which SGLang "
                           f"{table.sglang_version} does not have")
        if occ.problem:
            return _advice(f"the example's {which} command is not one SGLang "
                           f"{table.sglang_version} accepts: {occ.problem}")
    return cl


def derive_action(example: str, table: OptionTable) -> ExampleFix:
    """The one flag change between the example's before and after command lines."""
    if not example.strip():
        return _advice("the record has no exampleFix")
    sections = split_example(example)
    if sections is None:
        return _advice("the exampleFix has no '# before' and '# after' command lines")
    parsed: list[CommandLine] = []
    for which, section in zip(("before", "after"), sections, strict=True):
        try:
            args = sglang_args(section)
        except ValueError as exc:
            return _advice(f"the example's {which} command cannot be split: {exc}")
        if not args:
            return _advice(f"the example's {which} section holds no command line "
                           "(a comment only)")
        cl = _parse(args, table, which)
        if isinstance(cl, ExampleFix):
            return cl
        parsed.append(cl)
    before, after = (cl.effective() for cl in parsed)
    changed = sorted(f for f in before.keys() | after.keys()
                     if f not in before or f not in after or before[f] != after[f])
    if len(changed) != 1:
        return _advice("the example changes nothing" if not changed else
                       f"the example changes {len(changed)} flags at once "
                       f"({', '.join(changed)})")
    flag = changed[0]
    if flag == "--model-path":
        return _advice("the example serves a different model (--model-path)")
    if is_denied(flag):
        return _advice(f"the example changes {flag}, which no rule may change (deny list)")
    old, new = before.get(flag), after.get(flag)
    if flag not in after:
        return ExampleFix(FixKind.DROP_FLAG, flag, (old,) if old is not None else None)
    spec = table.spec(flag)
    if spec.nargs not in (None, 0, 1, "?"):
        return _advice(f"the example sets {flag}, which takes several values")
    if flag not in before:
        return ExampleFix(FixKind.SET_FLAG, flag, None, new)
    return ExampleFix(FixKind.REWRITE_VALUE, flag, (old,) if old is not None else None, new)


# --- records to rules ----------------------------------------------------------------------


def slugify(text: str) -> str:
    """A rule id made of lower-case letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "record"


def _rule_id(entry: Entry, used: set[str]) -> str:
    rule_id = slugify(_text(entry.record, "slug") or f"record-{entry.id}")
    return rule_id if rule_id not in used else f"{rule_id}-{slugify(entry.id)}"


def _source(record: Mapping[str, Any]) -> str | None:
    path = _text(record, "filePath")
    if not path:
        return None
    line = record.get("lineNumber")
    where = f"{path}:{line}" if isinstance(line, int) and not isinstance(line, bool) else path
    sha = _text(record, "analyzedSha")
    return f"{where} at {sha}" if sha else where


def _explanation(record: Mapping[str, Any]) -> str:
    parts = [_text(record, "documentation")]
    if trigger := _text(record, "triggerScenarios"):
        parts.append(f"Triggered by: {trigger}")
    if seen := _text(record, "commonSituations"):
        parts.append(f"Common situations: {seen}")
    return "\n".join(p for p in parts if p)


def convert(entry: Entry, table: OptionTable, rule_id: str) -> tuple[Rule | None, list[Note]]:
    """One record as a rule (None when it cannot be one), with what to report about it."""
    record = entry.record
    pattern, problem = build_pattern(record)
    if pattern is None:
        return None, [Note(entry.id, problem or "no pattern", skipped=True)]
    act = derive_action(_text(record, "exampleFix"), table)
    solutions = _texts(record, "solutions")
    notes = [Note(entry.id, f"advice only: {act.why}")] if act.action == FixKind.ADVICE else []
    message = _text(record, "errorMessage")
    if message and not compile_pattern(pattern).search(f"{_text(record, 'errorClass')}: {message}"):
        notes.append(Note(entry.id, "the pattern does not match the record's own errorMessage"))
    reason = (f"no automatic action: {act.why}" if act.action == FixKind.ADVICE
              else (solutions[0] if solutions else _text(record, "errorMessage")))
    rule = Rule(
        id=rule_id, pattern=pattern, action=act.action,
        flags=(act.flag,) if act.flag else (), values=act.values,
        new_value=None if act.new_value is None else Literal(act.new_value),
        reason=reason, source=_source(record), record=entry.id,
        explanation=_explanation(record), solutions=solutions,
        prevention=_texts(record, "preventionTips"),
    )
    return rule, notes


def message_in_source(record: Mapping[str, Any], source: str) -> bool:
    """True when the file's text holds the record's message (literally, or by its pattern)."""
    message = _text(record, "errorMessage")
    if message and message in source:
        return True
    pattern, _ = build_pattern({**record, "errorClass": None})
    if pattern is None:
        return False
    compiled = compile_pattern(pattern)
    return any(compiled.search(line) for line in source.splitlines())


def import_records(entries: Iterable[Entry], table: OptionTable,
                   sources: Mapping[str, str | None] | None = None) -> Imported:
    """Every record as a rule; with `sources` (filePath -> the release's text, None when
    the release has no such file), records whose message the release lacks are skipped."""
    entries = list(entries)
    rules: list[Rule] = []
    notes: list[Note] = []
    used: set[str] = set()
    for entry in entries:
        if sources is not None:
            text = sources.get(_text(entry.record, "filePath"))
            if text is None or not message_in_source(entry.record, text):
                notes.append(Note(entry.id, f"SGLang {table.sglang_version}'s "
                                  f"{_text(entry.record, 'filePath') or 'source'} does not hold "
                                  "this message; skipped", skipped=True))
                continue
        rule, said = convert(entry, table, _rule_id(entry, used))
        notes += said
        if rule is not None:
            used.add(rule.id)
            rules.append(rule)
    version = next((e.dataset_version for e in entries if e.dataset_version), None)
    return Imported(tuple(rules), tuple(notes), version, len(entries))


# --- writing -------------------------------------------------------------------------------


# Left raw by json.dumps(ensure_ascii=False): DEL (which TOML forbids raw), the C1 controls
# and the Unicode line/bidi controls (which a terminal showing the pack would act on).
_RAW_CONTROLS = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _toml(value: str | tuple[str, ...]) -> str:
    # A JSON string is a TOML basic string (same escapes); lone surrogates cannot be either.
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    text = json.dumps(value.encode("utf-8", "replace").decode("utf-8"), ensure_ascii=False)
    return _RAW_CONTROLS.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def render_pack(name: str, versions: str, imported: Imported, origin: str) -> str:
    """The rule pack's TOML text."""
    lines = [f"# Imported by `sglang-guard rules import` from {origin}",
             f"# (dataset version {imported.dataset_version or 'unknown'}; "
             f"{len(imported.rules)} rules from {imported.records} records).",
             "", "[pack]", f"name = {_toml(name)}", f"sglang_versions = {_toml(versions)}"]
    for rule in imported.rules:
        lines += ["", "[[rules]]", f"id = {_toml(rule.id)}", f"record = {_toml(rule.record or '')}",
                  f"pattern = {_toml(rule.pattern)}", f"action = {_toml(rule.action)}"]
        if rule.flags:
            lines.append(f"flags = {_toml(rule.flags)}")
        if rule.values is not None:
            lines.append(f"values = {_toml(rule.values)}")
        if rule.new_value is not None:
            lines.append(f"new_value = {_toml(rule.new_value.text)}")
        lines.append(f"reason = {_toml(rule.reason)}")
        if rule.source:
            lines.append(f"source = {_toml(rule.source)}")
        if rule.explanation:
            lines.append(f"explanation = {_toml(rule.explanation)}")
        if rule.solutions:
            lines.append(f"solutions = {_toml(rule.solutions)}")
        if rule.prevention:
            lines.append(f"prevention = {_toml(rule.prevention)}")
    return "\n".join(lines) + "\n"
