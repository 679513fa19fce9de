"""`sglang-guard rules import`: read a dataset (and a release's source), write a rule pack.

The conversion is `core/dataset.py`; this module picks the release (and its option table),
reads the files, and checks the pack it writes exactly as `run` will load it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from sglang_guard.core.dataset import Entry, Imported, import_records, read_dataset, render_pack
from sglang_guard.core.options import OptionTable, load_option_table
from sglang_guard.core.packcheck import check_pack
from sglang_guard.core.rulepack import RulePack, parse_pack
from sglang_guard.errors import InputError
from sglang_guard.resources import config_path
from sglang_guard.shell.files import read_text, write_atomic

_TABLE = re.compile(r"^options-(.+)\.json$")


@dataclass(frozen=True, slots=True)
class ImportOutcome:
    """The pack text written (or to print), and what the import said."""

    text: str
    pack: RulePack
    imported: Imported


def shipped_releases() -> list[str]:
    """The SGLang releases whose option table ships with the guard, oldest first."""
    found = [m.group(1) for p in config_path("sglang").glob("options-*.json")
             if (m := _TABLE.match(p.name))]
    return sorted(found, key=Version)


def _read(path: str, what: str) -> str:
    try:
        return read_text(path)
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc})") from None


def _tables_in(versions: str) -> list[OptionTable]:
    try:
        spec = SpecifierSet(versions)
    except InvalidSpecifier as exc:
        raise InputError(f"--sglang-version {versions!r}: not a version range ({exc})") from None
    shipped = shipped_releases()
    inside = [v for v in shipped if Version(v) in spec]
    if not inside:
        raise InputError(f"--sglang-version {versions!r} holds none of the releases this guard "
                         f"has an option table for ({', '.join(shipped)})")
    return [load_option_table(v) for v in inside]


def release_of(src: str) -> str:
    """The SGLang version installed in a site-packages directory (its dist-info)."""
    for meta in sorted(Path(src).glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    raise InputError(f"--sglang-src {src}: no sglang-*.dist-info here (give the site-packages "
                     "directory of an SGLang install)")


def _sources(src: str, entries: list[Entry]) -> dict[str, str | None]:
    """Each record's filePath -> that file's text in the release (None when it has none)."""
    out: dict[str, str | None] = {}
    for entry in entries:
        rel = entry.record.get("filePath")
        if not isinstance(rel, str) or rel in out:
            continue
        path = Path(src) / rel.removeprefix("python/")
        try:
            out[rel] = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            out[rel] = None
    return out


def import_dataset(dataset: str, *, output: str | None, versions: str | None,
                   sglang_src: str | None, name: str | None) -> ImportOutcome:
    """Convert `dataset` into a checked pack; written to `output` when given."""
    entries = read_dataset(_read(dataset, "dataset"), dataset)
    sources: dict[str, str | None] | None = None
    if versions is not None:
        tables = _tables_in(versions)
    elif sglang_src is not None:
        release = release_of(sglang_src)
        try:
            Version(release)
        except InvalidVersion:
            raise InputError(f"--sglang-src {sglang_src}: unreadable version {release!r}") from None
        if release not in shipped_releases():
            raise InputError(f"--sglang-src {sglang_src}: SGLang {release} has no option table "
                             f"in this guard ({', '.join(shipped_releases())})")
        tables, versions = [load_option_table(release)], f"=={release}"
        sources = _sources(sglang_src, entries)
    else:
        raise InputError("rules import needs the release: --sglang-version RANGE, or "
                         "--sglang-src SITE_PACKAGES of an SGLang install")
    imported = import_records(entries, tables[-1], sources)
    if not imported.rules:
        raise InputError(f"{dataset}: no record gave a rule "
                         f"({'; '.join(f'{n.record}: {n.problem}' for n in imported.notes)})")
    stem = Path(output or dataset).stem
    text = render_pack(name or stem, versions, imported, Path(dataset).name)
    pack = parse_pack(text, output or "<stdout>")
    for table in tables:  # the pack is checked exactly as `run` will load it
        check_pack(pack, table)
    if output is not None:
        try:
            write_atomic(output, text)
        except OSError as exc:
            raise InputError(f"{output}: cannot write the rule pack ({exc})") from None
    return ImportOutcome(text, pack, imported)
