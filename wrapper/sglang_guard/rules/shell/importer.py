"""`sglang-guard rules import`: read a dataset (and a release's source), write a rule pack.

The conversion is `rules/dataset.py`; this module picks the release (and its option table:
the newest shipped release in `--sglang-version`, or the release installed at `--sglang-src`),
reads the files, and checks the pack it writes against that table, as `run` checks packs.
"""

from __future__ import annotations

from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from sglang_guard.common.record import record
from sglang_guard.common.shell.files import read_text, write_atomic
from sglang_guard.errors import InputError
from sglang_guard.rules.dataset import Entry, Imported, import_records, read_dataset, render_pack
from sglang_guard.rules.packcheck import check_pack
from sglang_guard.rules.rulepack import RulePack, parse_pack
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.releases import known_releases, load_option_table
from sglang_guard.sglang.shell.release import find_release


@record
class ImportOutcome:
    """The pack text written (or to print), and what the import said."""

    text: str
    pack: RulePack
    imported: Imported


def _read(path: str, what: str) -> str:
    try:
        return read_text(path)
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc})") from None


def _table_in(versions: str) -> OptionTable:
    """The option table of the newest shipped release inside `versions`."""
    try:
        spec = SpecifierSet(versions)
    except InvalidSpecifier as exc:
        raise InputError(f"--sglang-version {versions!r}: not a version range ({exc})") from None
    inside = [v for v in known_releases() if Version(v) in spec]
    if not inside:
        raise InputError(f"--sglang-version {versions!r} holds none of the releases this guard "
                         f"has an option table for ({known_releases()[0]} to "
                         f"{known_releases()[-1]})")
    return load_option_table(max(inside, key=Version))


def _release_at(src: str) -> str:
    """The SGLang version installed in a site-packages directory (sglang/shell/release reads it)."""
    fact = find_release([src])
    if fact is None:
        raise InputError(f"--sglang-src {src}: no SGLang here (give the site-packages directory "
                         "of an SGLang install)")
    if fact.version not in known_releases():
        raise InputError(f"--sglang-src {src}: SGLang {fact.version} has no option table in this "
                         f"guard ({known_releases()[0]} to {known_releases()[-1]})")
    return fact.version


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
        table = _table_in(versions)
    elif sglang_src is not None:
        release = _release_at(sglang_src)
        table, versions = load_option_table(release), f"=={release}"
        sources = _sources(sglang_src, entries)
    else:
        raise InputError("rules import needs the release: --sglang-version RANGE, or "
                         "--sglang-src SITE_PACKAGES of an SGLang install")
    imported = import_records(entries, table, sources)
    if not imported.rules:
        raise InputError(f"{dataset}: no record gave a rule "
                         f"({'; '.join(f'{n.record}: {n.problem}' for n in imported.notes)})")
    stem = Path(output or dataset).stem
    text = render_pack(name or stem, versions, imported, Path(dataset).name)
    pack = check_pack(parse_pack(text, output or "<stdout>"), table)  # as `run` loads it
    if output is not None:
        try:
            write_atomic(output, text)
        except OSError as exc:
            raise InputError(f"{output}: cannot write the rule pack ({exc})") from None
    return ImportOutcome(text, pack, imported)
