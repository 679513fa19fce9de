"""The guard's own TOML tables, decoded once per version of the file: a JSON copy in the cache.

tomllib is pure Python: configs/backends.toml (~40 KB) takes longer to decode than the rest
of a cached `check` does to decide (issue 24). The decoded data is kept as JSON under
`$SGLANG_GUARD_CACHE/tables/`, named by the SHA-256 of the file's bytes, so an edited or
upgraded table is never answered from an old copy; a copy that does not decode is decoded
afresh from the TOML. JSON holds every value these tables have (strings, numbers, booleans,
arrays, tables); a table with a TOML date in it is decoded every time instead.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from sglang_guard.common.sha import sha256
from sglang_guard.common.shell.files import write_atomic
from sglang_guard.config.tomlread import load
from sglang_guard.preflight.shell.modelprobe import cache_root


def decoded_toml(path: Path) -> dict[str, Any]:
    """The TOML document at `path` as data (ConfigError naming `path` when it is not TOML)."""
    raw = path.read_bytes()
    copy = cache_root() / "tables" / f"{path.stem}-{sha256(raw).hexdigest()[:32]}.json"
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(copy.read_bytes())
        if isinstance(data, dict):
            return data
    data = load(raw.decode("utf-8"), str(path))
    with contextlib.suppress(OSError, TypeError, ValueError):  # no cache, or a TOML date
        write_atomic(copy, json.dumps(data).encode())
    return data
