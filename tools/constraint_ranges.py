#!/usr/bin/env python3
"""Which SGLang releases hold each cited message of configs/backends.toml (read from the wheels).

    tools/constraint_ranges.py            # print the range of every constraint
    tools/constraint_ranges.py --write    # write `sglang = "..."` into configs/backends.toml

A constraint acts (drops, rewrites, refuses) only on a release whose own source holds its
message: SGLang rewords its checks between releases, and a check that is not in the release
that runs is no rule of that release. The range written is the newest contiguous run of
releases (oldest first order) whose source holds every literal part of the message; a
constraint without a message of its own (a kernel assert, an import error) gets the release
the table was read from. Wheels come from `tools/fetch-sglang-wheels` (cached outside the
repo); nothing is imported, the .py files are read as text.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.version import Version

from sglang_guard.core.msgsearch import NOT_SERVER, holds, normalise, parts

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "configs" / "backends.toml"
RELEASES = REPO / "configs" / "sglang" / "releases.txt"


def wheel_dir() -> Path:
    """Where tools/fetch-sglang-wheels keeps the wheels."""
    import os

    cache = os.environ.get("SGLANG_GUARD_CACHE") or str(Path.home() / ".cache" / "sglang-guard")
    return Path(cache) / "wheels"


def releases() -> list[str]:
    """Shipped releases, oldest first."""
    lines = RELEASES.read_text(encoding="utf-8").splitlines()
    return [v.strip() for v in lines if v.strip() and not v.startswith("#")]


def source_text(wheel: Path) -> str:
    """Every .py file of the sglang package in `wheel`, joined."""
    with zipfile.ZipFile(wheel) as zf:
        text = "\n".join(zf.read(n).decode("utf-8", "replace") for n in zf.namelist()
                          if n.startswith("sglang/") and n.endswith(".py")
                          and not n.startswith(NOT_SERVER))
    return normalise(text)


def spec_for(present: list[bool], versions: list[str], fallback: str) -> str:
    """A PEP 440 specifier for the newest contiguous run of releases marked present."""
    if not any(present):
        return f"=={fallback}"
    last = max(i for i, p in enumerate(present) if p)
    first = last
    while first > 0 and present[first - 1]:
        first -= 1
    lo = f">={versions[first]}"
    if last == len(versions) - 1:
        return lo
    return f"{lo},<{versions[last + 1]}"


def constraints(doc: dict[str, object]) -> list[tuple[str, int, str | None]]:
    """(backend, index, message) for every constraint, in file order."""
    out: list[tuple[str, int, str | None]] = []
    for name, backend in doc["backends"].items():  # type: ignore[attr-defined]
        for i, c in enumerate(backend.get("constraints", [])):
            out.append((name, i, c.get("message")))
    return out


def write(text: str, specs: dict[tuple[str, int], str]) -> str:
    """`text` with a `sglang = "..."` line under each constraint header (replacing any)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    counts: dict[str, int] = {}
    header = re.compile(r"^\[\[backends\.([A-Za-z0-9_.@\"-]+?)\.constraints\]\]\s*$")
    skip_old = False
    for line in lines:
        if skip_old and line.startswith("sglang = "):
            skip_old = False
            continue
        skip_old = False
        out.append(line)
        m = header.match(line)
        if m:
            name = m.group(1).strip('"')
            i = counts.get(name, 0)
            counts[name] = i + 1
            out.append(f'sglang = "{specs[(name, i)]}"\n')
            skip_old = True
    return "".join(out)


def release_texts() -> tuple[list[str], list[str]] | None:
    """(versions oldest first, each one's server source), or None with a line on stderr."""
    versions = sorted(releases(), key=Version)
    texts: list[str] = []
    for v in versions:
        found = sorted(wheel_dir().glob(f"sglang-{v}-*.whl"))
        if not found:
            print(f"missing wheel for {v}: run tools/fetch-sglang-wheels", file=sys.stderr)
            return None
        texts.append(source_text(found[0]))
    return versions, texts


def main() -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update configs/backends.toml")
    args = ap.parse_args()
    loaded = release_texts()
    if loaded is None:
        return 2
    versions, texts = loaded
    doc = tomllib.loads(TABLE.read_text(encoding="utf-8"))
    read_from = str(doc["meta"]["sglang_version"])  # type: ignore[index]
    specs: dict[tuple[str, int], str] = {}
    for name, i, message in constraints(doc):
        if message is None or not parts(message):
            specs[(name, i)] = f"=={read_from}"
        else:
            specs[(name, i)] = spec_for([holds(t, message) for t in texts], versions, read_from)
        print(f"{name}[{i}]: {specs[(name, i)]}")
    if args.write:
        TABLE.write_text(write(TABLE.read_text(encoding="utf-8"), specs), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
