"""Flags SGLang removed or renamed, per release, and what a command line should do about them.

The table (configs/sglang/renames.json) is derived from the wheels by tools/sglang_tables.py:
a flag present in one release and absent from the next is `removed_in` the next; its
successor is read from the deprecation note SGLang wrote in the last release that had it
("Deprecated alias for --x", "[Deprecated] Use --x instead", "set `--x` to 'v'"), cited
file:line, and kept only if the successor exists in the release that removed the flag.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from packaging.version import Version

from sglang_guard.common.record import record
from sglang_guard.errors import ConfigError
from sglang_guard.sglang.argv import CommandLine
from sglang_guard.sglang.options import OptionTable

RENAMES_FILE = ("sglang", "renames.json")

_SUCCESSOR = (
    r"(?i)alias for (--[\w-]+)(?:[= ]([\w.-]*\w))?(?![\w{<-])",
    r"[Uu]se (--[\w-]+)(?:[= ]([\w.-]*\w))? instead",
    r"[Uu]se (--[\w-]+)[= ][{<][^ ]*[}>] instead",
    r"[Uu]se (--[\w-]+)=([\w.-]*\w)",
    r"set `(--[\w-]+)` to '([\w.-]+)'",
)
_VALUE_MAP = r"'([\w.-]+)' maps to '([\w.-]+)'"


@record
class Rename:
    """One flag that left SGLang, and its successor when SGLang named one."""

    flag: str
    last_in: str  # the newest release that still accepts the flag
    removed_in: str  # the first release that does not
    successor: str | None  # None: removed without successor
    value: str | None  # the successor's fixed value (`--x=v`), None to keep the user's
    takes_value: bool  # the old flag took a value
    note: str  # SGLang's own deprecation note ("" when it left none)
    source: str  # file:line of that note in `last_in`
    value_map: Mapping[str, str] | None = None  # old value -> new ("'a' maps to 'b'")


@record
class RenameFinding:
    """What to do with one occurrence of a flag the release no longer (or not yet) has."""

    flag: str
    value: str | None
    action: Literal["rename", "drop"]
    new_flag: str | None
    new_value: str | None
    changed_in: str  # the release that removed (or, for "downgrade", introduced) the name
    reason: str
    source: str
    index: int  # cli index of the option token, -1 for YAML
    count: int = 1  # argv tokens the old spelling spans (2 when its value is the next token)


def successor_from_note(note: str) -> tuple[str, str | None] | None:
    """(successor flag, fixed value or None) named by a deprecation note."""
    for pattern in map(re.compile, _SUCCESSOR):  # re's own cache keeps them
        match = pattern.search(note)
        if match:
            groups = match.groups()
            value = groups[1] if len(groups) > 1 else None
            return groups[0], value
    return None


def derive_renames(releases: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> list[Rename]:
    """Renames between consecutive releases (oldest first). Each option is a mapping with
    `strings`, `nargs`, `help` and `where` (file:line), as the static reader registers it."""
    out: list[Rename] = []
    for (old_v, old_opts), (new_v, new_opts) in itertools.pairwise(releases):
        new_strings = {s for o in new_opts for s in o["strings"]}
        for opt in old_opts:
            for flag in opt["strings"]:
                if flag in new_strings or not flag.startswith("--"):
                    continue
                note = str(opt.get("help") or "")
                found = successor_from_note(note) if "eprecat" in note or "lias" in note else None
                successor, value = found if found else (None, None)
                if successor is not None and successor not in new_strings:
                    successor, value = None, None
                kept = note if "eprecat" in note or "lias" in note else ""
                out.append(Rename(flag, old_v, new_v, successor, value, opt["nargs"] != 0,
                                  " ".join(kept.split()), str(opt["where"]),
                                  dict(re.findall(_VALUE_MAP, kept)) or None))
    return out


def renames_to_json(renames: Sequence[Rename]) -> list[dict[str, Any]]:
    """The shipped JSON form."""
    return [
        {"flag": r.flag, "last_in": r.last_in, "removed_in": r.removed_in,
         "successor": r.successor, "value": r.value, "takes_value": r.takes_value,
         "note": r.note, "source": r.source, "value_map": r.value_map}
        for r in renames
    ]


def renames_from_json(data: Sequence[Mapping[str, Any]]) -> tuple[Rename, ...]:
    """Parse the shipped JSON form."""
    return tuple(
        Rename(str(d["flag"]), str(d["last_in"]), str(d["removed_in"]), d["successor"],
               d["value"], bool(d["takes_value"]), str(d["note"]), str(d["source"]),
               d.get("value_map"))
        for d in data
    )


_CACHE: list[tuple[Rename, ...]] = []


def load_renames() -> tuple[Rename, ...]:
    """The shipped rename table (read once per process)."""
    from sglang_guard.resources import config_path  # noqa: PLC0415 - keeps core import-light

    if not _CACHE:
        path = config_path(*RENAMES_FILE)
        try:
            _CACHE.append(renames_from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(str(path), None, f"cannot read the rename table: {exc}") from exc
    return _CACHE[0]


def _applies(r: Rename, release: str) -> bool:
    return Version(r.removed_in) <= Version(release)


def rename_findings(
    cmd: CommandLine, table: OptionTable, renames: Sequence[Rename] | None = None
) -> list[RenameFinding]:
    """Occurrences in `cmd` (parsed with `table`, the running release's) whose flag the release
    removed (rename to the successor keeping the value, or drop), or does not have yet while an
    older spelling it accepts exists ("downgrade": `--cuda-graph-max-bs-decode` on 0.5.12)."""
    renames = load_renames() if renames is None else renames
    release = table.sglang_version
    by_flag: dict[str, list[Rename]] = {}
    for r in renames:
        by_flag.setdefault(r.flag, []).append(r)
    by_successor = {r.successor: r for r in renames if r.successor and r.value is None}
    out: list[RenameFinding] = []
    for occ in cmd.occurrences:
        flag, value, count = occ.option, occ.value, max(occ.count, 1)
        if occ.spec is None and "=" in flag:
            flag, value = flag.split("=", 1)
        if table.lookup(flag).kind == "exact":
            continue
        if occ.origin == "yaml":
            count = 0
        elif value is None and occ.spec is None:
            nxt = occ.index + 1
            if nxt < len(cmd.argv) and not cmd.argv[nxt].startswith("-"):
                value, count = cmd.argv[nxt], 2
        hits = [r for r in by_flag.get(flag, ()) if _applies(r, release)]
        if hits:
            found = _forward(hits[-1], flag, value, table, index=occ.index, renames=renames)
            if not hits[-1].takes_value and count == 2 and occ.spec is None:
                count = 1
                found = _forward(hits[-1], flag, None, table, index=occ.index, renames=renames)
            out.append(replace(found, count=count))
            continue
        back = by_successor.get(flag)
        if back is not None and not _applies(back, release) and back.flag in table.by_string:
            out.append(RenameFinding(
                flag, value, "rename", back.flag, value, back.removed_in,
                f"{flag} exists only from SGLang {back.removed_in}; {release} spells it "
                f"{back.flag}", back.source, occ.index, count))
    return out


def _forward(r: Rename, flag: str, value: str | None, table: OptionTable, *, index: int,
             renames: Sequence[Rename]) -> RenameFinding:
    successor, fixed = r.successor, r.value
    seen = {flag}
    # Follow a chain of renames until a spelling the running release accepts.
    while successor is not None and successor not in table.by_string and successor not in seen:
        seen.add(successor)
        nxt = [x for x in renames if x.flag == successor and _applies(x, table.sglang_version)]
        if not nxt:
            successor = None
            break
        successor, fixed = nxt[-1].successor, nxt[-1].value or fixed
    if successor is None or successor not in table.by_string:
        why = f": {r.note}" if r.note else ""
        return RenameFinding(flag, value, "drop", None, None, r.removed_in,
                             f"SGLang {r.removed_in} removed {flag} without a successor{why}",
                             r.source, index)
    new_value = fixed if fixed is not None else (value if r.takes_value else None)
    if new_value is not None and r.value_map and new_value in r.value_map:
        new_value = r.value_map[new_value]
    choices = table.by_string[successor].choices
    if new_value is not None and choices is not None and new_value not in choices:
        return RenameFinding(flag, value, "drop", None, None, r.removed_in,
                             f"SGLang {r.removed_in} renamed {flag} to {successor}, which does "
                             f"not accept {new_value!r}: {r.note}", r.source, index)
    return RenameFinding(flag, value, "rename", successor, new_value, r.removed_in,
                         f"SGLang {r.removed_in} renamed {flag} to {successor}: {r.note}",
                         r.source, index)
