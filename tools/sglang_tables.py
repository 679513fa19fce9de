"""Generate the per-release SGLang tables from the releases' wheels, statically (no import).

    tools/fetch-sglang-wheels                 # the wheels, into ~/.cache/sglang-guard/wheels
    python tools/sglang_tables.py             # rewrite configs/sglang/releases.json, renames.json
                                              # and spellings.json
    python tools/sglang_tables.py --check     # exit 1 when the shipped tables drifted
    python tools/sglang_tables.py --one 0.5.24 --wheel path.whl   # print one release's table

A new release: add it to configs/sglang/releases.txt, fetch its wheel, run this.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "wrapper"))

from sglang_guard.sglang.options import parse_table  # noqa: E402
from sglang_guard.sglang.releases import decode_chain, encode_chain  # noqa: E402
from sglang_guard.sglang.renames import derive_renames, renames_to_json  # noqa: E402
from sglang_guard.sglang.sgl_options import release_table  # noqa: E402
from sglang_guard.sglang.shell.sglsource import wheel_reader  # noqa: E402

CONFIGS = REPO / "configs" / "sglang"


def wheel_dir() -> Path:
    """Where tools/fetch-sglang-wheels puts the wheels."""
    cache = os.environ.get("SGLANG_GUARD_CACHE") or str(Path.home() / ".cache" / "sglang-guard")
    return Path(cache) / "wheels"


def find_wheel(version: str, wheels: Path) -> Path | None:
    """The cached wheel of `version` (any platform tag)."""
    hits = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    return hits[0] if hits else None


def shipped_versions() -> list[str]:
    """configs/sglang/releases.txt, oldest first."""
    lines = (CONFIGS / "releases.txt").read_text(encoding="utf-8").splitlines()
    return sorted((ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")),
                  key=Version)


def dumps(data: Any) -> str:
    """The shipped JSON form: compact, one file line per release."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n"


def spellings(releases: dict[str, Any]) -> list[str]:
    """spellings.json: every shipped release's canonical option spellings, sorted.

    What `sglang_guard.rules.shell.packs.other_release_has` asks, without loading 42 option tables
    at run time. Each release's table is the one `load_option_table` reads: the shipped
    argparse dump where there is one (options-<version>.json), else the decoded chain.
    """
    found: set[str] = set()
    for version, table in decode_chain(releases).items():
        dump = CONFIGS / f"options-{version}.json"
        data = json.loads(dump.read_text(encoding="utf-8")) if dump.exists() else table
        found.update(o.canonical for o in parse_table(data, str(dump)).options)
    return sorted(found)


def read_one(version: str, wheel: Path) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """One release's table, its registrations (for the renames) and the seconds it took."""
    start = time.perf_counter()
    table, options = release_table(wheel_reader(wheel), version)
    regs = [{"strings": o.strings, "nargs": o.nargs, "help": o.help, "where": o.where}
            for o in options]
    return table, regs, time.perf_counter() - start


def generate(wheels: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, float]]:
    """(releases.json data, renames.json data, seconds per release); one process per core."""
    versions = shipped_versions()
    found = {v: find_wheel(v, wheels) for v in versions}
    missing = [v for v, w in found.items() if w is None]
    if missing:
        raise SystemExit(f"no wheel for {missing} in {wheels}: run tools/fetch-sglang-wheels")
    with ProcessPoolExecutor(max_workers=min(len(versions), os.cpu_count() or 1)) as pool:
        results = list(pool.map(read_one, versions, [found[v] for v in versions]))
    tables = [r[0] for r in results]
    regs = [(v, r[1]) for v, r in zip(versions, results, strict=True)]
    times = {v: r[2] for v, r in zip(versions, results, strict=True)}
    renames = renames_to_json(derive_renames(regs))
    return encode_chain(list(reversed(tables))), renames, times


def main() -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheels", type=Path, default=wheel_dir())
    ap.add_argument("--check", action="store_true", help="compare with the shipped tables")
    ap.add_argument("--one", metavar="VERSION", help="print one release's table as JSON")
    ap.add_argument("--wheel", type=Path, help="the wheel for --one (default: the cache's)")
    args = ap.parse_args()
    if args.one:
        wheel = args.wheel or find_wheel(args.one, args.wheels)
        if wheel is None:
            raise SystemExit(f"no wheel for {args.one}")
        table, _ = release_table(wheel_reader(wheel), args.one)
        json.dump(table, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    start = time.perf_counter()
    releases, renames, times = generate(args.wheels)
    total = time.perf_counter() - start
    out = {"releases.json": dumps(releases), "renames.json": dumps(renames),
           "spellings.json": dumps(spellings(releases))}
    if args.check:
        drift = [n for n, text in out.items()
                 if (CONFIGS / n).read_text(encoding="utf-8") != text]
        for n in drift:
            print(f"configs/sglang/{n} differs from what the wheels give", file=sys.stderr)
        return 1 if drift else 0
    for name, text in out.items():
        (CONFIGS / name).write_text(text, encoding="utf-8")
    decoded = decode_chain(releases)
    print(f"{len(decoded)} releases in {total:.1f} s "
          f"(slowest {max(times.values()):.2f} s); "
          f"releases.json {len(out['releases.json'])} B, renames.json "
          f"{len(out['renames.json'])} B, {len(renames)} removed flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
