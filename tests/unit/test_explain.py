"""`sglang-guard explain`: the rule packs over a saved log, first fatal match first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.config.guardconfig import GuardConfig, RulesSection
from sglang_guard.errors import EXIT_USAGE, InputError
from sglang_guard.rules.shell.explain import explain_log

PACK = """
[pack]
name = "test"
sglang_versions = ">=0.5.23"

[[rules]]
id = "fa3-sm"
pattern = 'FlashAttention v3 Backend requires SM>=80'
action = "drop_flag"
flags = ["--attention-backend", "--decode-attention-backend"]
values = ["fa3"]
reason = "fa3 needs SM80-90"

[[rules]]
id = "mem-low"
pattern = 'Not enough memory'
action = "set_flag"
flags = ["--mem-fraction-static"]
new_value = "0.8"

[[rules]]
id = "crash"
pattern = 'Scheduler hit an exception: '
action = "restart"
priority = -10

[[rules]]
id = "a-warning"
pattern = 'deprecated flag'
action = "restart"
fatal = false
"""
Files = tuple[Path, Path, GuardConfig]
LOG = [
    "[2026-01-01 10:00:00] server_args=ServerArgs(...)",
    "WARNING: deprecated flag --foo",
    "[2026-01-01 10:00:01] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "attention_registry.py", line 244, in create_flashattention_v3_backend',
    "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90.",
    "",
    "Traceback (most recent call last):",
    '  File "model_runner.py", line 1450, in init_memory_pool',
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
]


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Files:
    """(log file, guard config file, the same config as a value) using only the test pack."""
    monkeypatch.delenv("SGLANG_GUARD_CONFIG", raising=False)
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK)
    config = tmp_path / "guard.toml"
    config.write_text(f"[rules]\ndefault_pack = false\npacks = [{json.dumps(str(pack))}]\n")
    log = tmp_path / "server.log"
    log.write_text("\n".join(LOG) + "\n")
    cfg = GuardConfig(rules=RulesSection(default_pack=False, packs=(str(pack),)))
    return log, config, cfg


def test_fatal_specific_matches_first_then_catch_alls_then_warnings(files: Files) -> None:
    log, _, cfg = files
    found = [(m.line_no, m.rule.id) for m in explain_log(str(log), cfg)]
    assert found == [(5, "fa3-sm"), (9, "mem-low"), (3, "crash"), (2, "a-warning")]


def test_an_exception_line_counts_only_where_it_ends_a_traceback(tmp_path: Path,
                                                                  files: Files) -> None:
    """The second line of an exception's message is no exception line, whatever its shape."""
    _, _, cfg = files
    log = tmp_path / "s.log"
    log.write_text("\n".join([
        "[2026-01-01 10:00:00] server_args=ServerArgs(...)",
        "Traceback (most recent call last):",
        '  File "tokenizer_manager.py", line 900, in _validate',
        "ValueError: invalid stop string: 'x",
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.'",
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    ]) + "\n")
    assert explain_log(str(log), cfg) == []


def test_lines_are_cleaned_before_matching(tmp_path: Path, files: Files) -> None:
    _, _, cfg = files
    log = tmp_path / "ansi.log"
    huge = b"x" * (200 * 1024)
    log.write_bytes(b"\x1b[31mValueError: FlashAttention v3 Backend requires SM>=80\x1b[0m\r\n"
                    + huge + b"\n\xff\xfe binary \x00 junk\n")
    (match,) = explain_log(str(log), cfg)
    assert match.line_no == 1
    assert match.line == "ValueError: FlashAttention v3 Backend requires SM>=80"


def test_json_shape_and_first_fatal_first(files: Files) -> None:
    log, config, _ = files
    result = CliRunner().invoke(main, ["explain", "--json", "--config", str(config), str(log)])
    assert result.exit_code == 0, result.output
    matches = json.loads(result.output)["matches"]
    assert len(matches) == 4
    keys = ("line_no", "line", "rule", "flag", "action", "new_value")
    assert {k: matches[0][k] for k in keys} == {
        "line_no": 5, "line": LOG[4], "rule": "fa3-sm", "flag": "--attention-backend",
        "action": "drop_flag", "new_value": None}
    assert (matches[1]["rule"], matches[1]["new_value"]) == ("mem-low", "0.8")


def test_plain_output_shows_the_first_fatal_match_and_all_on_request(files: Files) -> None:
    log, config, _ = files
    first = CliRunner().invoke(main, ["explain", "--config", str(config), str(log)])
    assert first.exit_code == 0
    assert first.output.splitlines() == [
        f"line 5: {LOG[4]}",
        "  rule fa3-sm (test): drop_flag --attention-backend / --decode-attention-backend",
        "  why: fa3 needs SM80-90",
    ]
    every = CliRunner().invoke(main, ["explain", "--all", "--config", str(config), str(log)])
    assert every.output.count("\nline ") + every.output.startswith("line ") == 4
    assert "-> 0.8" in every.output


def test_reads_stdin_with_dash(files: Files) -> None:
    _, config, _ = files
    result = CliRunner().invoke(main, ["explain", "--json", "--config", str(config), "-"],
                                input=b"ok\n[2026-01-01 10:00:00 TP0] Scheduler hit an exception: "
                                      b"boom\n")
    assert result.exit_code == 0
    assert [(m["line_no"], m["rule"]) for m in json.loads(result.output)["matches"]] == [
        (2, "crash")]


def test_no_match_says_so(tmp_path: Path, files: Files) -> None:
    _, config, _ = files
    log = tmp_path / "clean.log"
    log.write_text("all good\n")
    result = CliRunner().invoke(main, ["explain", "--config", str(config), str(log)])
    assert (result.exit_code, result.output) == (0, "no rule matches this log\n")
    as_json = CliRunner().invoke(main, ["explain", "--json", "--config", str(config), str(log)])
    assert json.loads(as_json.output) == {"matches": []}


def test_missing_log_is_a_usage_error(tmp_path: Path, files: Files) -> None:
    _, config, cfg = files
    with pytest.raises(InputError, match="cannot read"):
        explain_log(str(tmp_path / "nope.log"), cfg)
    result = CliRunner().invoke(main, ["explain", "--config", str(config),
                                       str(tmp_path / "nope.log")])
    assert result.exit_code == EXIT_USAGE
    assert "cannot read" in result.output
    assert "Traceback" not in result.output


def test_the_default_pack_is_used_without_a_config(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGLANG_GUARD_CONFIG", raising=False)
    log = tmp_path / "s.log"
    log.write_text("[2026-01-01 10:00:00 TP0] Scheduler hit an exception: "
                   "Traceback (most recent call last):\n")
    (match,) = explain_log(str(log), GuardConfig())
    assert match.rule.pack == "default"
    assert match.rule.priority < 0


def test_explain_with_the_command_line_names_the_one_flag_change(files: Files) -> None:
    log, config, _ = files
    runner = CliRunner()
    args = ["explain", "--config", str(config), str(log), "--",
            "--model-path", "m", "--attention-backend", "fa3"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "fix: drop --attention-backend fa3 (fa3-sm)" in result.output
    result = runner.invoke(main, ["explain", "--config", str(config), "--json",
                                  "--argv", "--model-path m", str(log)])
    doc = json.loads(result.output)
    # fa3-sm has nothing to drop here; the next specific line's rule sets the memory flag.
    assert doc["fix"]["rule"] == "mem-low" and doc["fix"]["new_value"] == "0.8"


def test_explain_reads_a_pasted_launcher_as_check_does(files: Files) -> None:
    log, config, _ = files
    runner = CliRunner()
    bare = ["--model-path", "m", "--attention-backend", "fa3"]
    said = {runner.invoke(main, ["explain", "--config", str(config), str(log), "--", *words]
                          ).output
            for words in (bare, ["python3", "-m", "sglang.launch_server", *bare],
                          ["CUDA_VISIBLE_DEVICES=0", "sglang", "serve", "m", *bare[2:]])}
    assert len(said) == 1
    assert "fix: drop --attention-backend fa3 (fa3-sm)" in said.pop()
    doc = json.loads(runner.invoke(main, ["explain", "--config", str(config), "--json", "--argv",
                                          "python -m sglang.launch_server --model-path m",
                                          str(log)]).output)
    assert doc["fix"]["rule"] == "mem-low"


def test_explain_without_a_command_line_names_no_fix(files: Files) -> None:
    log, config, _ = files
    result = CliRunner().invoke(main, ["explain", "--config", str(config), "--json", str(log)])
    assert "fix" not in json.loads(result.output)
