"""No false drop: every command line SGLang documents as working passes `check` unchanged.

The lines, their GPU and where they are written: tests/data/documented-lines.toml. Each is
checked on every shipped release whose parser has all its flags and values (from the line's
`releases` on), with the GPU it was documented for.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglang_guard.cli import main
from sglang_guard.sglang.releases import known_releases, load_release

REPO = Path(__file__).resolve().parents[2]
LINES: list[dict[str, Any]] = tomllib.loads(
    (REPO / "tests" / "data" / "documented-lines.toml").read_text(encoding="utf-8"))["line"]
# Every shipped release (0.5.1 on): an option a release lacks is a normal state (issue 19
# item 1), so the old releases are judged like the new ones.
OLDEST = Version("0.5.1")


def _accepts(release: str, argv: list[str]) -> bool:
    """Whether the release's parser has every flag of `argv` and each choice it names."""
    table = load_release(release).options
    for i, tok in enumerate(argv):
        if not tok.startswith("--"):
            continue
        spec = table.by_string.get(tok)
        if spec is None:  # argparse takes a unique prefix ("--tp" for "--tp-size")
            hits = {table.by_string[s].dest for s in table.by_string if s.startswith(tok)}
            if len(hits) != 1:
                return False
            spec = next(table.by_string[s] for s in table.by_string if s.startswith(tok))
        if spec.choices is not None and i + 1 < len(argv) and argv[i + 1] not in spec.choices:
            return False
    return True


def _cases() -> list[tuple[dict[str, Any], str]]:
    out = []
    for line in LINES:
        spec = SpecifierSet(line.get("releases", ""))
        argv = [a.replace("{model}", "M") for a in line["argv"]]
        for release in known_releases():
            if (Version(release) >= OLDEST and spec.contains(release, prereleases=True)
                    and _accepts(release, argv)):
                out.append((line, release))
    return out


CASES = _cases()


def test_the_corpus_covers_every_line_and_its_sources() -> None:
    covered = {line["what"] for line, _ in CASES}
    assert covered == {line["what"] for line in LINES}
    assert all(line["source"] for line in LINES)
    assert len(LINES) >= 20


@pytest.mark.parametrize(("line", "release"), CASES,
                         ids=[f"{r}-{line['what'][:40]}" for line, r in CASES])
def test_documented_line_passes_unchanged(line: dict[str, Any], release: str) -> None:
    argv = [a.replace("{model}", str(REPO / line["model"])) for a in line["argv"]]
    res = CliRunner().invoke(main, ["check", "--json", "--gpu-sm", str(line["sm"]),
                                    "--sglang-version", release, "--", *argv],
                             catch_exceptions=False)
    out = json.loads(res.stdout)
    assert (res.exit_code, out["verdict"], out["argv_out"]) == (0, "ok", argv), (
        line["source"], out["findings"])
