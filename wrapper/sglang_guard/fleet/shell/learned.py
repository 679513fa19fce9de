"""`sglang-guard learned list|show|forget|export`: the fleet store's entries, for a person.

Export turns an entry into something to review and ship: a rule pack (one rule per edit,
its pattern the fatal line that led to it) or an entry file for a `file://` store (the same
JSON a guard reads before its first launch, so an image can carry reviewed fixes).
"""

from __future__ import annotations

import json
import re
from typing import Any

from sglang_guard.common.outcomes import FixKind
from sglang_guard.common.record import record
from sglang_guard.config.guardconfig import LearnSection
from sglang_guard.errors import InputError
from sglang_guard.fleet import fleet as core
from sglang_guard.fleet.shell.fleetstore import Store, StoreError, open_store

EXPORT_FORMATS = ("pack", "entry")
_META = re.compile(r"([\\.^$|?*+()\[\]{}])")


@record
class Listed:
    """One key of the store, read (or why it could not be)."""

    key: str
    entry: core.Entry | None
    problem: str | None = None


def store_for(learn: LearnSection, url: str | None) -> Store:
    """The store `--store` or the guard config's `[learn] store` names."""
    if url:
        from dataclasses import replace  # noqa: PLC0415

        learn = replace(learn, store=url)
    if not learn.store:
        raise InputError("no fleet store: set [learn] store in the guard config or pass --store")
    return open_store(learn)


def _fail(exc: StoreError) -> InputError:
    return InputError(f"fleet store: {exc}")


def listing(store: Store) -> list[Listed]:
    """Every entry, decoded (malformed ones named, not hidden)."""
    try:
        out = []
        for key in store.names():
            raw = store.get(key)
            if raw is None:
                continue
            try:
                out.append(Listed(key, core.decode_entry(raw, key)))
            except ValueError as exc:
                out.append(Listed(key, None, str(exc)))
        return out
    except StoreError as exc:
        raise _fail(exc) from None


def resolve(store: Store, prefix: str) -> str:
    """The one key that starts with `prefix` (at least 8 hex digits)."""
    prefix = prefix.strip().lower()
    if len(prefix) < 8 or not set(prefix) <= core.KEY_CHARS:
        raise InputError(f"{prefix!r}: give a key or at least its first 8 hex digits")
    try:
        hits = [k for k in store.names() if k.startswith(prefix)]
    except StoreError as exc:
        raise _fail(exc) from None
    if len(hits) != 1:
        raise InputError(f"{prefix}: {'no key' if not hits else 'several keys'} in "
                         f"{store.where} start with it")
    return hits[0]


def entry(store: Store, key: str) -> core.Entry:
    """The entry under `key`, decoded."""
    try:
        raw = store.get(key)
    except StoreError as exc:
        raise _fail(exc) from None
    if raw is None:
        raise InputError(f"{key}: no entry (expired or forgotten)")
    try:
        return core.decode_entry(raw, key)
    except ValueError as exc:
        raise InputError(f"{key}: malformed entry ({exc})") from None


def forget(store: Store, key: str) -> bool:
    """Remove the entry."""
    try:
        return store.delete(key)
    except StoreError as exc:
        raise _fail(exc) from None


def line_of(item: Listed) -> str:
    """One line of `learned list`."""
    e = item.entry
    if e is None:
        return f"{item.key[:16]}  malformed: {item.problem}"
    edits = ", ".join(_edit_text(x) for x in e.edits)
    return (f"{item.key[:16]}  {e.status:<9}  {edits}  (SGLang {e.origin.sglang or '?'}, "
            f"{e.origin.gpu or 'GPU ?'}; by {e.origin.guard} at {e.origin.learned_at}; "
            f"confirmed {e.confirmations})")


def _edit_text(edit: core.FleetEdit) -> str:
    if edit.action == FixKind.DROP_FLAG:
        return f"drop {edit.flag} {edit.old_value or ''}".rstrip()
    return f"set {edit.flag} {edit.new_value or ''}".rstrip()


def as_json(item: Listed) -> dict[str, Any]:
    """One entry for `--json`."""
    if item.entry is None:
        return {"key": item.key, "malformed": item.problem}
    return item.entry.to_json()


def _pattern(line: str) -> str:
    return _META.sub(r"\\\1", line)


def export_pack(e: core.Entry) -> str:
    """A rule pack (TOML) with one rule per edit; its pattern is the fatal line behind it."""
    if not e.lines:
        raise InputError(f"{e.key}: the entry keeps no fatal line to write a rule from")
    version = e.origin.sglang or ""
    out = [f"# Exported from fleet entry {e.key} (learned by {e.origin.guard} at "
           f"{e.origin.learned_at}, confirmed {e.confirmations} times).",
           "# Review the patterns before shipping: they are the fatal lines as seen.",
           "[pack]", f"name = {json.dumps('fleet-' + e.key[:12])}",
           f"sglang_versions = {json.dumps('==' + version if version else '>=0')}", ""]
    for i, edit in enumerate(e.edits):
        line = e.lines[min(i, len(e.lines) - 1)]
        rule = ["[[rules]]", f"id = {json.dumps(f'fleet-{e.key[:12]}-{i + 1}')}",
                f"pattern = {json.dumps(_pattern(line))}", f"action = {json.dumps(edit.action)}",
                f"flags = [{json.dumps(edit.flag)}]"]
        if edit.action == FixKind.DROP_FLAG and edit.old_value is not None:
            rule.append(f"values = [{json.dumps(edit.old_value)}]")
        if edit.action == FixKind.SET_FLAG and edit.new_value is not None:
            rule.append(f"new_value = {json.dumps(edit.new_value)}")
        why = e.rules[i] if i < len(e.rules) else "fleet"
        rule.append(f"reason = {json.dumps('learned by the fleet: ' + why)}")
        out += [*rule, ""]
    return "\n".join(out)


def export_entry(e: core.Entry) -> str:
    """The entry as a `file://` store holds it (name the file `<key>.json`)."""
    return json.dumps(e.to_json(), indent=2, sort_keys=True) + "\n"
