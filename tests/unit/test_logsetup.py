"""The guard's own log lines: structlog's shape, masked, and no asyncio behind them."""

from __future__ import annotations

import datetime
import io
import json
import subprocess
import sys

from sglang_guard.common.shell import logsetup

NOW = datetime.datetime(2026, 12, 1, 20, 0, 0, 123456, tzinfo=datetime.UTC)


def test_json_line_is_the_call_then_event_level_timestamp() -> None:
    line = logsetup.render("child.start", "info", {"gen": 1, "argv": ["--port", "1"]},
                           as_json=True, now=NOW)
    assert list(json.loads(line).items()) == [
        ("gen", 1), ("argv", ["--port", "1"]), ("event", "child.start"), ("level", "info"),
        ("timestamp", "2026-12-01T20:00:00.123456Z")]


def test_secrets_are_masked_in_both_formats() -> None:
    values = {"flag": "--api-key", "value": "sk-abcdefabcdefabcdef", "note": "x"}
    for as_json in (True, False):
        line = logsetup.render("remediated", "warning", values, as_json=as_json, now=NOW)
        assert "sk-abcdef" not in line


def test_console_line_sorts_keys_and_pads() -> None:
    line = logsetup.render("ready", "info", {"b": "two words", "a": 1}, as_json=False, now=NOW)
    assert line == f"2026-12-01T20:00:00.123456Z [info     ] {'ready':<30} a=1 b='two words'"


def test_level_filter_and_stream() -> None:
    out = io.StringIO()
    logsetup.configure("json", stream=out, level=logsetup.INFO)
    try:
        log = logsetup.get_logger()
        log.debug("not.shown", x=1)
        log.error("shown", x=2)
    finally:
        logsetup.configure("json")
    [line] = out.getvalue().splitlines()
    assert json.loads(line)["event"] == "shown"


def test_importing_and_logging_pulls_no_asyncio_or_ssl() -> None:
    code = ("import sys; from sglang_guard.common.shell import logsetup;"
            "logsetup.configure('json'); logsetup.get_logger().info('x.y', a=1);"
            "print(sorted(m for m in ('asyncio', 'ssl', 'structlog') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "[]"
    assert json.loads(done.stderr)["event"] == "x.y"
