"""The static reader against real argparse, on a tiny fake SGLang, and on the cached wheels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.sglang.sgl_arch import arch_lists
from sglang_guard.sglang.sgl_ast import Evaluator, Unknown
from sglang_guard.sglang.sgl_options import option_dump, release_table
from sglang_guard.sglang.shell.sglsource import dir_reader
from support.sglang import WHEELS_MISSING, missing

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "data" / "fake-sglang"
EXTRACT = REPO / "tools" / "extract_sglang_options.py"


def _argparse_dump(root: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(EXTRACT)], capture_output=True, text=True, check=True,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(root)}, timeout=60,
    )
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def _sorted_choices(table: dict[str, Any], dests: set[str],
                    seen: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The options, unordered choice lists sorted; with `seen` (the static table), a default
    the static reader could not evaluate (and so left out) is left out here too."""
    static = {tuple(o["strings"]): o for o in (seen or table)["options"]}
    return [
        {k: v for k, v in o.items() if k != "default" or "default" in static[tuple(o["strings"])]}
        | ({"choices": sorted(o["choices"])} if o["dest"] in dests and o["choices"] else {})
        for o in table["options"]
    ]


def test_fake_release_reads_like_its_own_argparse() -> None:
    static, _ = option_dump(dir_reader(FAKE), "9.9.9")
    live = _argparse_dump(FAKE)
    unordered = set(static["unordered_choices"])
    assert unordered == {"sampling"}
    assert _sorted_choices(static, unordered) == _sorted_choices(live, unordered, static)
    assert static["sglang_version"] == live["sglang_version"]
    # The `if` SGLang's module takes only with an env var set is reported, not guessed.
    assert any("FAKE_SGLANG_EXTRA" in n for n in static["notes"])


def test_fake_release_lists_and_deprecations() -> None:
    table, options = release_table(dir_reader(FAKE), "9.9.9")
    assert table["deprecated"] == {
        "--old-tp": "Deprecated alias for --tp-size. (sglang/srt/server_args.py:46)"}
    where = {o.strings[0]: o.where for o in options}
    assert where["--tensor-parallel-size"] == "sglang/srt/server_args.py:29"
    arch = table["arch"]
    assert arch["mla"] == ["DeepseekV3ForCausalLM"]
    assert arch["mla_conditional"] == ["PixtralForConditionalGeneration"]
    assert arch["mha"] == ["DeepseekV4ForCausalLM"]
    assert arch["ssm"] == ["MambaForCausalLM"]
    assert arch["draft_renames"] == {"DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN",
                                     "QwenMoe": "QwenMTP", "QwenNext": "QwenMTP"}


def test_what_the_evaluator_cannot_see_raises_unknown() -> None:
    src = {"sglang/m.py": "import os\nX = os.getcwd()\nY = [1] + [2]\n"}
    ev = Evaluator(src.get)
    assert ev.name("sglang.m", "Y") == [1, 2]
    with pytest.raises(Unknown):
        ev.name("sglang.m", "X")
    with pytest.raises(Unknown):
        ev.name("sglang.missing", "Z")


def test_no_model_config_gives_no_lists() -> None:
    assert arch_lists({}.get) == {"source": None}


# -- the real wheels (tools/fetch-sglang-wheels; CI runs it before the tests) ------------


# Read once at import: the unit tests' fixtures point SGLANG_GUARD_CACHE at a temp dir.
WHEELS = Path(os.environ.get("SGLANG_GUARD_CACHE") or Path.home() / ".cache/sglang-guard")
WHEELS /= "wheels"


def _wheel(version: str) -> Path | None:
    hits = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    return hits[0] if hits else None


def test_0523_wheel_reads_like_the_argparse_dump() -> None:
    from sglang_guard.sglang.shell.sglsource import wheel_reader  # noqa: PLC0415

    wheel = _wheel("0.5.23")
    if wheel is None:
        missing("0.5.23 wheel not cached (run tools/fetch-sglang-wheels)")
    static, _ = option_dump(wheel_reader(wheel), "0.5.23")
    dump = json.loads((REPO / "configs/sglang/options-0.5.23.json").read_text())
    unordered = set(static["unordered_choices"])
    assert _sorted_choices(static, unordered) == _sorted_choices(dump, unordered, static)
    # Where the static reader gives a default at all, it is the parser's (never a guess).
    assert sum("default" in o for o in static["options"]) > 0.9 * len(static["options"])


def _all_wheels() -> bool:
    lines = (REPO / "configs/sglang/releases.txt").read_text().splitlines()
    return all(_wheel(v) is not None for v in lines if v and not v.startswith("#"))


def test_every_shipped_table_regenerates_from_its_wheel() -> None:
    if not _all_wheels():
        missing(WHEELS_MISSING)
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import sglang_tables  # type: ignore[import-not-found]  # noqa: PLC0415
    finally:
        sys.path.remove(str(REPO / "tools"))
    releases, renames, _ = sglang_tables.generate(WHEELS)
    shipped = REPO / "configs" / "sglang"
    assert sglang_tables.dumps(releases) == (shipped / "releases.json").read_text()
    assert sglang_tables.dumps(renames) == (shipped / "renames.json").read_text()
    assert sglang_tables.dumps(sglang_tables.spellings(releases)) == (
        shipped / "spellings.json").read_text()


def test_every_rename_cites_the_line_of_its_note() -> None:
    if not _all_wheels():
        missing(WHEELS_MISSING)
    from sglang_guard.sglang.renames import load_renames  # noqa: PLC0415
    from sglang_guard.sglang.shell.sglsource import wheel_reader  # noqa: PLC0415

    readers: dict[str, Any] = {}
    for r in load_renames():
        wheel = _wheel(r.last_in)
        assert wheel is not None
        read = readers.setdefault(r.last_in, wheel_reader(wheel))
        path, line = r.source.rsplit(":", 1)
        text = read(path)
        assert text is not None, r.source
        # The add_argument call (or field) starts at the cited line; its option string and
        # the first words of its note follow within it.
        block = "\n".join(text.splitlines()[int(line) - 1 : int(line) + 30])
        flag = r.flag.replace("--no-", "--")  # BooleanOptionalAction's generated spelling
        name = flag[2:].replace("-", "_")
        assert flag in block or name in block, f"{r.flag} not at {r.last_in} {r.source}"
        if r.note:
            first = r.note.split()[0].strip("[]:.")
            assert first in block, f"{r.flag}: note not at {r.last_in} {r.source}"


# Releases whose own parser runs with third-party imports stubbed (tools/stubbed_argparse_dump.py).
STUBBABLE = ("0.5.1", "0.5.1.post3")


@pytest.mark.parametrize("version", STUBBABLE)
def test_table_equals_the_releases_own_parser_where_it_imports_without_torch(
    version: str, tmp_path: Path
) -> None:
    import zipfile  # noqa: PLC0415

    from sglang_guard.sglang.releases import shipped_table  # noqa: PLC0415

    wheel = _wheel(version)
    if wheel is None:
        missing(f"{version} wheel not cached (run tools/fetch-sglang-wheels)")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path, [n for n in archive.namelist() if n.startswith("sglang/")])
    out = subprocess.run(
        [sys.executable, "-S", str(REPO / "tools" / "stubbed_argparse_dump.py"), str(tmp_path),
         sysconfig.get_paths()["purelib"]],  # for typing_extensions, which is real
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    live = json.loads(out.stdout)
    every = {o["dest"] for o in live["options"]}
    shipped = shipped_table(version)
    assert _sorted_choices(shipped, every) == _sorted_choices(live, every, shipped)
