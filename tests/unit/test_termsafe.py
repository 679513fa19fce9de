"""Issue 22, item 5: record and log text is printed escaped on a terminal (explain, rules
import): an OSC, a CSI, a CR or a C1 control in it is shown, never acted on."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.common.termsafe import printable

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "data" / "seed-error-record.json"
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b]8;;http://evil.example/\x07click\x1b]8;;\x07\rOK\x9b31m"
RAW = ("\x1b", "\x07", "\r", "\x9b")


def test_printable_shows_every_control_but_newline_and_tab() -> None:
    assert printable("a\tb\nc") == "a\tb\nc"
    shown = printable(HOSTILE)
    assert not any(ch in shown for ch in RAW)
    assert shown.startswith("\\x1b]0;owned\\x07\\x1b[2J")
    assert "\\r" in shown and "\\x9b" in shown
    assert printable("\u202eevil") == "\\u202eevil"  # a right-to-left override
    for code in range(0x20, 0x7f):
        assert printable(chr(code)) == chr(code)


def _hostile_seed(tmp_path: Path) -> Path:
    data = json.loads(SEED.read_text())
    record = data.get("record", data)
    record["solutions"] = [f"Drop the flag {HOSTILE}", *record.get("solutions", [])[1:]]
    record["explanation"] = f"because {HOSTILE}"
    path = tmp_path / "hostile.jsonl"
    path.write_text(json.dumps(data) + "\n")
    return path


def test_rules_import_and_explain_print_record_text_escaped(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    runner = CliRunner()
    result = runner.invoke(main, ["rules", "import", str(_hostile_seed(tmp_path)),
                                  "--sglang-version", ">=0.5.23,<0.5.24"])
    assert result.exit_code == 0, result.output
    assert not any(ch in result.output for ch in RAW)
    pack.write_text(result.stdout)  # the pack as printed: valid TOML, the text in escapes
    assert "\\u009b" in result.stdout
    config = tmp_path / "guard.toml"
    config.write_text(f"[rules]\ndefault_pack = false\npacks = [{json.dumps(str(pack))}]\n")
    message = json.loads(SEED.read_text())["record"]["errorMessage"]
    log = tmp_path / "server.log"
    log.write_text(f"[2026-11-29] boot\nValueError: {message} {HOSTILE}\n")
    text = runner.invoke(main, ["explain", "--config", str(config), str(log)]).output
    assert "solution: Drop the flag" in text  # the record matched and its text is shown ...
    assert not any(ch in text for ch in RAW), repr(text)  # ... escaped
    assert "\\x1b]0;owned" in text
