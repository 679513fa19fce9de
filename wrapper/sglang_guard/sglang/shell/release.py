"""Which SGLang release an interpreter will run, read from disk without importing SGLang.

The interpreter is asked only for its `sys.path` (the same environment the launch will
have); the version comes from the `sglang-*.dist-info/METADATA` beside the `sglang` package
that `import sglang` would find first, else from `sglang/version.py` of a source checkout.
An unknown release whose source is readable gets its tables derived from that source with
the same static reader as tools/sglang_tables.py, cached by the dist-info RECORD's hash.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sglang_guard.common.record import record
from sglang_guard.common.sha import sha256
from sglang_guard.common.shell.files import write_atomic
from sglang_guard.errors import InputError
from sglang_guard.sglang.releases import (
    ReleaseTables,
    build_release,
    known_releases,
    load_release,
)

# The answer is delimited: whatever the interpreter prints before it (a sitecustomize
# banner, a conda hook) is not read as the answer.
_MARK = "@@sglang-guard-sys-path@@"
_SYS_PATH = f"import json, sys; print(); print({_MARK!r} + json.dumps(sys.path))"
_VERSION_PY = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)
_FORMAT = 1  # bump when the derived table's shape changes: old cache entries are ignored


@record
class ReleaseFact:
    """The SGLang version an interpreter has, and where that was read."""

    version: str
    source: str  # e.g. "dist-info:/venv/.../sglang-0.5.23.dist-info/METADATA"
    site: Path | None  # the directory holding the `sglang` package (None: not found on disk)
    record: Path | None  # the dist-info RECORD, when there is one


def interpreter_path(python: str, timeout: float = 10.0) -> list[str]:
    """`sys.path` of `python` as the launch will see it (site processed, sglang not imported)."""
    import subprocess  # noqa: PLC0415 - only with --python: a cached `check` starts none

    try:
        done = subprocess.run(
            [python, "-c", _SYS_PATH], capture_output=True, text=True, timeout=timeout,
            check=False, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise InputError(f"cannot ask {python} for its sys.path: {exc}") from exc
    answers = [ln[len(_MARK):] for ln in done.stdout.splitlines() if ln.startswith(_MARK)]
    try:
        path = json.loads(answers[-1]) if done.returncode == 0 and answers else None
    except ValueError:
        path = None
    if not isinstance(path, list):
        said = _last_words(done.stderr) or _last_words(done.stdout) or "no output"
        raise InputError(f"cannot ask {python} for its sys.path (exit {done.returncode}): "
                         f"{said}")
    return [str(p) for p in path]


def _last_words(text: str) -> str:
    """The interpreter's own last lines, as one line (a traceback's last line says why)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[:500]


def _metadata_version(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
        if not line.strip():
            break
    return None


def find_release(path: list[str], cwd: Path | None = None) -> ReleaseFact | None:
    """The SGLang that `import sglang` would load from `path`, without loading it."""
    for entry in path:
        site = Path(entry) if entry else (cwd or Path.cwd())
        if not (site / "sglang" / "__init__.py").is_file():
            continue
        for dist in sorted(site.glob("sglang-*.dist-info")):
            meta = dist / "METADATA"
            try:
                version = _metadata_version(meta.read_text(encoding="utf-8"))
            except OSError:
                continue
            if version:
                record = dist / "RECORD"
                return ReleaseFact(version, f"dist-info:{meta}", site,
                                   record if record.is_file() else None)
        version_py = site / "sglang" / "version.py"
        try:
            match = _VERSION_PY.search(version_py.read_text(encoding="utf-8"))
        except OSError:
            match = None
        if match:
            return ReleaseFact(match.group(1), f"version.py:{version_py}", site, None)
        return None  # the package that wins has no version we can read
    return _dist_only(path, cwd)


def _dist_only(path: list[str], cwd: Path | None) -> ReleaseFact | None:
    """A dist-info without the package beside it (an editable install's import hook)."""
    for entry in path:
        site = Path(entry) if entry else (cwd or Path.cwd())
        for dist in sorted(site.glob("sglang-*.dist-info")):
            try:
                version = _metadata_version((dist / "METADATA").read_text(encoding="utf-8"))
            except OSError:
                continue
            if version:
                return ReleaseFact(version, f"dist-info:{dist / 'METADATA'}", None, None)
    return None


def has_sglang(path: list[str], cwd: Path | None = None) -> bool:
    """True when `import sglang` could find a package (or a dist-info says it is installed)."""
    for entry in path:
        site = Path(entry) if entry else (cwd or Path.cwd())
        if (site / "sglang").is_dir() or any(site.glob("sglang-*.dist-info")):
            return True
    return False


def read_release(python: str) -> ReleaseFact | None:
    """The SGLang release of interpreter `python` (None: it has no SGLang we can read)."""
    return find_release(interpreter_path(python))


def _cache_key(fact: ReleaseFact) -> str:
    digest = sha256(f"{_FORMAT}:{fact.version}:".encode())
    if fact.record is not None:
        digest.update(fact.record.read_bytes())
    elif fact.site is not None:  # a source checkout: the files the reader looks at
        for rel in ("server_args.py", "configs/model_config.py"):
            p = fact.site / "sglang" / "srt" / rel
            if p.is_file():
                digest.update(p.read_bytes())
    return digest.hexdigest()[:24]


def _log() -> Any:
    """The guard's logger, imported only when there is something to say (`check` stays light)."""
    from sglang_guard.common.shell.logsetup import get_logger  # noqa: PLC0415

    return get_logger(__name__)


def derive_release(fact: ReleaseFact, cache_dir: Path) -> ReleaseTables:
    """Tables for an unshipped release, read from its source on disk (cached)."""
    # The static reader is large; only an unshipped release needs it.
    from sglang_guard.sglang.sgl_options import release_table  # noqa: PLC0415
    from sglang_guard.sglang.shell.sglsource import dir_reader  # noqa: PLC0415

    if fact.site is None:
        raise InputError(f"SGLang {fact.version}: no source on disk to read its tables from")
    path = cache_dir / "sglang-tables" / f"{_cache_key(fact)}.json"
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        _log().debug("release.tables_cached", version=fact.version, path=str(path))
    except (OSError, ValueError):
        table, _ = release_table(dir_reader(fact.site), fact.version)
        try:
            write_atomic(path, json.dumps(table, separators=(",", ":")))
        except OSError as exc:  # a read-only cache costs a re-read next time, nothing more
            _log().warning("release.cache_unwritable", path=str(path), error=str(exc))
        _log().info("release.tables_derived", version=fact.version, path=str(path))
    return build_release(table, fact.version, str(path), origin="derived")


def tables_for(fact: ReleaseFact, cache_dir: Path) -> ReleaseTables:
    """The shipped tables when the release is shipped; else derived from its source; else
    the nearest older shipped table (origin "nearest")."""
    if fact.version in known_releases():
        return load_release(fact.version)
    if fact.site is not None:
        try:
            return derive_release(fact, cache_dir)
        except Exception as exc:
            _log().warning("release.derive_failed", version=fact.version, error=str(exc))
    return load_release(fact.version)
