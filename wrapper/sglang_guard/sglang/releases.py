"""Every shipped SGLang release's tables: option table, choice lists, arch lists, renames.

configs/sglang/releases.json holds the newest release's option table in full and, for each
older release, the edit script that turns its newer neighbour's option list into its own
(`n` keeps n entries, `-n` skips n, an object inserts that entry). tools/sglang_tables.py
writes it from the wheels; `encode_chain` / `decode_chain` are the two halves, kept together.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from packaging.version import InvalidVersion, Version

from sglang_guard.common.record import record
from sglang_guard.errors import ConfigError
from sglang_guard.sglang.options import OptionTable, parse_table

RELEASES_FILE = ("sglang", "releases.json")
# The option lists preflight reads, by the dest of the option that lists them.
CHOICE_LISTS = (
    "attention_backend", "prefill_attention_backend", "decode_attention_backend",
    "kv_cache_dtype", "quantization", "moe_runner_backend", "speculative_algorithm",
)


@record
class ArchLists:
    """What model_config.py of one release says about attention architectures."""

    mla: tuple[str, ...]
    mla_conditional: tuple[str, ...]  # MLA only when a config field also holds
    mha: tuple[str, ...]  # named explicitly as MHA (e.g. DeepSeek-V4)
    ssm: tuple[str, ...]
    draft_renames: Mapping[str, str]
    draft_renames_conditional: Mapping[str, str]


@record
class ReleaseTables:
    """One release's tables; `release` is the table's version, `requested` what was asked."""

    release: str
    requested: str
    exact: bool
    options: OptionTable
    choices: Mapping[str, tuple[str, ...]]
    arch: ArchLists
    deprecated: Mapping[str, str]  # option string -> SGLang's own deprecation note
    notes: tuple[str, ...]  # what the static reader could not see, file:line
    origin: str = "shipped"  # shipped | nearest (an older shipped table) | derived (its source)


def _key(entry: Mapping[str, Any]) -> str:
    return str(entry["strings"][0])


def encode_ops(newer: Sequence[Mapping[str, Any]], older: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The edit script turning `newer`'s option list into `older`'s."""
    import difflib  # noqa: PLC0415 - only the table generator needs it (22 ms to import)

    a = [json.dumps(o, sort_keys=True) for o in newer]
    b = [json.dumps(o, sort_keys=True) for o in older]
    ops: list[Any] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            ops.append(i2 - i1)
            continue
        if i2 > i1:
            ops.append(-(i2 - i1))
        ops.extend(older[j1:j2])
    return ops


def apply_ops(newer: Sequence[Mapping[str, Any]], ops: Sequence[Any]) -> list[Mapping[str, Any]]:
    """Replay an edit script written by `encode_ops`."""
    out: list[Mapping[str, Any]] = []
    pos = 0
    for op in ops:
        if isinstance(op, dict):
            out.append(op)
        elif op >= 0:
            out.extend(newer[pos : pos + op])
            pos += op
        else:
            pos -= op
    if pos != len(newer):
        raise ValueError(f"edit script covers {pos} of {len(newer)} entries")
    return out


_META = ("unordered_choices", "notes", "arch", "deprecated")


def encode_chain(tables: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Newest first: the first table in full, each next one as a script against the previous."""
    head, *rest = tables
    chain = []
    newer = head
    for table in rest:
        entry = {"sglang_version": table["sglang_version"], "ops": encode_ops(
            newer["options"], table["options"])}
        entry.update({k: table[k] for k in _META if k in table})
        chain.append(entry)
        newer = table
    return {"format": 1, "newest": dict(head), "chain": chain}


def decode_chain(data: Mapping[str, Any], stop: str | None = None) -> dict[str, dict[str, Any]]:
    """Every release's full table by version (newest first), or down to release `stop`."""
    newer = dict(data["newest"])
    out = {str(newer["sglang_version"]): newer}
    for entry in data["chain"]:
        if stop is not None and stop in out:
            break
        table = {
            "sglang_version": entry["sglang_version"],
            "allow_abbrev": True,
            "options": apply_ops(newer["options"], entry["ops"]),
        }
        table.update({k: entry[k] for k in _META if k in entry})
        out[str(entry["sglang_version"])] = table
        newer = table
    return out


def nearest_release(version: str, known: Sequence[str]) -> str | None:
    """`version` if shipped, else the newest shipped release older than it (None: older
    than every table, or not a version)."""
    if version in known:
        return version
    try:
        wanted = Version(version)
    except InvalidVersion:
        return None
    older = [v for v in known if Version(v) <= wanted]
    return max(older, key=Version) if older else None


def build_release(
    table: Mapping[str, Any], requested: str, path: str, origin: str | None = None
) -> ReleaseTables:
    """ReleaseTables from one decoded table."""
    options = parse_table(table, path)
    choices = {
        dest: tuple(options.by_dest[dest].choices or ())
        for dest in CHOICE_LISTS
        if dest in options.by_dest and options.by_dest[dest].choices is not None
    }
    arch = table.get("arch") or {}
    return ReleaseTables(
        release=options.sglang_version,
        requested=requested,
        exact=requested == options.sglang_version,
        options=options,
        choices=choices,
        arch=ArchLists(
            mla=tuple(arch.get("mla", ())),
            mla_conditional=tuple(arch.get("mla_conditional", ())),
            mha=tuple(arch.get("mha", ())),
            ssm=tuple(arch.get("ssm", ())),
            draft_renames=dict(arch.get("draft_renames", {})),
            draft_renames_conditional=dict(arch.get("draft_renames_conditional", {})),
        ),
        deprecated={k: str(v) for k, v in (table.get("deprecated") or {}).items()},
        notes=tuple(table.get("notes", ())),
        origin=origin or ("shipped" if requested == options.sglang_version else "nearest"),
    )


_RAW: list[Mapping[str, Any]] = []
_BUILT: dict[str, ReleaseTables] = {}
_NEWEST: list[Mapping[str, Any]] = []
# How tools/sglang_tables.py writes the file (encode_chain's keys in order, compact): the
# newest release's table follows this and is decoded alone, a third of the file (a check of
# the newest release decodes nothing more: ~3 ms of a cached `check` here).
_NEWEST_AT = '{"format":1,"newest":'


def _read() -> str:
    from sglang_guard.resources import config_path  # noqa: PLC0415 - keeps core import-light

    path = config_path(*RELEASES_FILE)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), None, f"cannot read the SGLang release tables: {exc}"
                          ) from exc


def _raw() -> Mapping[str, Any]:
    from sglang_guard.resources import config_path  # noqa: PLC0415 - keeps core import-light

    if not _RAW:
        path = config_path(*RELEASES_FILE)
        try:
            data = json.loads(_read())
            data["newest"]["sglang_version"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                str(path), None, f"cannot read the SGLang release tables: {exc}"
            ) from exc
        _RAW.append(data)
    return _RAW[0]


def _newest() -> Mapping[str, Any]:
    """The newest release's table: decoded alone where the file starts as the tools write
    it (else, or where that part does not decode as a table, from the whole file)."""
    if not _NEWEST:
        newest: Any = None
        if not _RAW:
            text = _read()
            if text.startswith(_NEWEST_AT):
                try:
                    newest, _ = json.JSONDecoder().raw_decode(text, len(_NEWEST_AT))
                except ValueError:
                    newest = None
        if not isinstance(newest, dict) or not isinstance(newest.get("sglang_version"), str):
            newest = _raw()["newest"]
        _NEWEST.append(newest)
    return _NEWEST[0]


def newest_release() -> str:
    """The newest release with a shipped table (known_releases()[-1], without the others)."""
    return str(_newest()["sglang_version"])


_KNOWN: list[tuple[str, ...]] = []  # known_releases' answer, once per process (as _RAW)


def known_releases() -> tuple[str, ...]:
    """Every release with a shipped table, oldest first."""
    if not _KNOWN:
        data = _raw()
        versions = [str(data["newest"]["sglang_version"])]
        versions += [str(e["sglang_version"]) for e in data["chain"]]
        _KNOWN.append(tuple(sorted(versions, key=Version)))
    return _KNOWN[0]


def shipped_table(version: str) -> dict[str, Any]:
    """The decoded JSON table of a shipped release (KeyError when not shipped); only the
    scripts between the newest release and `version` are replayed."""
    if version == newest_release():
        return dict(_newest())
    return decode_chain(_raw(), stop=version)[version]


def load_release(version: str) -> ReleaseTables:
    """The tables for `version`: its own, or the nearest older release's (exact=False).

    Raises ConfigError when `version` is older than every table or not a version.
    """
    if version in _BUILT:
        return _BUILT[version]
    found = version if version == newest_release() else nearest_release(version,
                                                                        known_releases())
    if found is None:
        raise ConfigError(
            "/".join(RELEASES_FILE), None,
            f"no table for SGLang {version!r}: the oldest shipped is {known_releases()[0]}",
        )
    built = build_release(shipped_table(found), version, "/".join(RELEASES_FILE))
    _BUILT[version] = built
    return built


_OPTION_TABLES: dict[str, OptionTable] = {}


def load_option_table(version: str | None = None) -> OptionTable:
    """The shipped table of SGLang `version`'s parser (read once per process; None: the
    newest shipped release): the argparse dump where one is shipped (the newest), else the
    table generated from the release's wheel."""
    from sglang_guard.resources import config_path  # noqa: PLC0415 - keeps core import-light

    if version is None:
        version = newest_release()

    if version not in _OPTION_TABLES:
        path = config_path("sglang", f"options-{version}.json")
        if not path.exists():  # every other release: the generated per-release tables
            release = load_release(version)
            if not release.exact:
                raise ConfigError(
                    str(path), None, f"cannot read the SGLang option table: none for {version}"
                )
            _OPTION_TABLES[version] = release.options
            return _OPTION_TABLES[version]
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                str(path), None, f"cannot read the SGLang option table: {exc}"
            ) from exc
        _OPTION_TABLES[version] = parse_table(data, str(path))
    return _OPTION_TABLES[version]
