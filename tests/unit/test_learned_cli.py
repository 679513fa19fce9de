"""`sglang-guard learned list|show|forget|export` over a file:// store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.fleet import fleet
from sglang_guard.fleet.shell.fleetstore import FileStore
from sglang_guard.rules.packcheck import check_pack
from sglang_guard.rules.rules import MatchContext, Matcher, first_fix, parse_pack
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table

KEY = "ab" * 32
LINE = "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90. (got sm100)"


def _entry(status: str = "proven") -> fleet.Entry:
    return fleet.Entry(KEY, status, (fleet.FleetEdit("--attention-backend", "drop_flag", "fa3"),),
                       ("fa3-sm",), (LINE,), 1,
                       fleet.Origin("node-7:1234abcd", "2026-12-01T20:00:00+00:00", "0.5.23",
                                    "NVIDIA B200 sm100"), confirmations=4)


@pytest.fixture
def store(tmp_path: Path) -> str:
    FileStore(str(tmp_path / "fleet"), 3600).put(KEY, _entry().encode())
    return f"file://{tmp_path / 'fleet'}"


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["learned", *args])
    return result.exit_code, result.stdout, result.stderr


def test_list_and_show(store: str) -> None:
    code, out, _ = cli("list", "--store", store)
    assert code == 0
    assert out.startswith(KEY[:16]) and "proven" in out and "drop --attention-backend fa3" in out
    assert "confirmed 4" in out and "node-7:1234abcd" in out
    code, out, _ = cli("list", "--store", store, "--json")
    assert code == 0 and json.loads(out)[0]["key"] == KEY
    code, out, _ = cli("show", "--store", store, KEY[:10])
    assert code == 0 and json.loads(out)["edits"][0]["flag"] == "--attention-backend"


def test_forget(store: str) -> None:
    assert cli("forget", "--store", store, KEY)[0] == 0
    assert cli("list", "--store", store)[1] == ""
    code, _, err = cli("show", "--store", store, KEY)
    assert code == 2 and "no key" in err


def test_export_as_a_rule_pack_that_checks_and_fires(store: str, tmp_path: Path) -> None:
    out = tmp_path / "pack.toml"
    code, _, _ = cli("export", "--store", store, "--as", "pack", "-o", str(out), KEY[:8])
    assert code == 0
    pack = parse_pack(out.read_text(), str(out))
    table = load_option_table("0.5.23")
    check_pack(pack, table)  # raises on anything the release would not take
    argv = ("--model-path", "/m", "--attention-backend", "fa3")
    cl = parse_command_line(argv, table)
    ctx = MatchContext(cl.effective(), "mha", 100, "0.5.23", table, None)
    fix, _ = first_fix(Matcher([pack]), LINE, ctx, {})
    assert fix is not None and fix.flag == "--attention-backend" and fix.action == "drop_flag"


def test_export_as_an_entry_a_file_store_serves(store: str, tmp_path: Path) -> None:
    shipped = tmp_path / "image-fleet"
    shipped.mkdir(mode=0o700)
    target = shipped / f"{KEY}.json"
    assert cli("export", "--store", store, "--as", "entry", "-o", str(target), KEY)[0] == 0
    assert target.stat().st_mode & 0o777 == 0o600
    again = fleet.decode_entry(FileStore(str(shipped), 3600).get(KEY) or b"", KEY)
    assert again == _entry()


@pytest.mark.parametrize(("args", "needle"), [
    (("list",), "no fleet store"),
    (("show", "--store", "file:///nonexistent-fleet", "zz"), "first 8 hex digits"),
    (("list", "--store", "redis://x"), "expected file://"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], needle: str,
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(*args)
    assert code == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
