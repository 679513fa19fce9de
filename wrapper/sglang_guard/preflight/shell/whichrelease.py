"""Which SGLang release preflight decides for, and where that fact came from.

Asked before preflight: an explicit version (`check --sglang-version`, `[sglang] version`)
wins; else the release installed for the interpreter that will run SGLang (dist-info, no
import of sglang); else the newest shipped table, said so in the source.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from sglang_guard.common.record import record
from sglang_guard.errors import GuardError, InputError, SglangMissing
from sglang_guard.preflight.shell.modelprobe import cache_dir
from sglang_guard.sglang.releases import ReleaseTables, load_release, newest_release


@record
class Release:
    """The release's tables and where its version was read."""

    tables: ReleaseTables
    source: str
    site: Path | None = None  # the directory holding its `sglang` package, when on disk

    @property
    def version(self) -> str:
        """The version that will run (which may be newer than the table used)."""
        return self.tables.requested

    def source_text(self) -> str | None:
        """Its installed .py files, normalised for message search (None: no source on disk)."""
        if self.site is None or not (self.site / "sglang").is_dir():
            return None
        from sglang_guard.sglang.msgsearch import NOT_SERVER, normalise  # noqa: PLC0415

        chunks = []
        for path in sorted((self.site / "sglang").rglob("*.py")):
            if path.relative_to(self.site).as_posix().startswith(NOT_SERVER):
                continue
            with contextlib.suppress(OSError):
                chunks.append(path.read_text(encoding="utf-8", errors="replace"))
        return normalise("\n".join(chunks))


def _load(version: str, source: str) -> Release:
    try:
        return Release(load_release(version), source)
    except GuardError as exc:
        raise InputError(f"{source}: {exc}") from None


def resolve_release(*, version: str | None, version_source: str, python: str | None,
                    unknown_why: str = "no --python or --sglang-version given",
                    runs_sglang: bool = True) -> Release:
    """The release for an explicit `version`, else for interpreter `python`, else the newest.

    `runs_sglang`: `python` itself will run SGLang (`python -m sglang.launch_server`, or the
    interpreter `check --python` names), so one without SGLang is SglangMissing (exit 69).
    False for a custom launch command (`sglang serve`, `[sglang] launch`), whose SGLang may
    live elsewhere: then the newest table is used, and the output says so."""
    if version:
        return _load(version, version_source)
    if python:
        from sglang_guard.sglang.shell.release import (  # noqa: PLC0415 - --python only
            find_release,
            has_sglang,
            interpreter_path,
            tables_for,
        )

        path = interpreter_path(python)  # a failed probe: InputError with its own stderr
        fact = find_release(path)
        if fact is None and runs_sglang and not has_sglang(path):
            shown = ", ".join(p or "''" for p in path)
            raise SglangMissing(f"{python} has no SGLang: `import sglang` finds no package on "
                                f"its sys.path [{shown}]; install SGLang there, or name the "
                                "interpreter that has it (--python, [sglang] python)")
        if fact is not None:
            try:
                return Release(tables_for(fact, cache_dir()), fact.source, fact.site)
            except GuardError as exc:
                raise InputError(f"SGLang {fact.version} ({fact.source}): {exc}") from None
        newest = newest_release()
        return _load(newest, f"newest table ({python} has no SGLang the guard can read)")
    newest = newest_release()
    return _load(newest, f"newest table ({unknown_why})")
