"""The release probe of an interpreter (issue 19, item 7): a delimited answer, a failed probe
is exit 2 with the interpreter's own words, no SGLang is exit 69 at once.

The interpreters here are real: this Python with a `sitecustomize` that prints a banner, and
small executable scripts standing in for a broken or counted interpreter.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.errors import EXIT_ENVIRONMENT, EXIT_USAGE, InputError, SglangMissing
from sglang_guard.preflight.shell.whichrelease import resolve_release
from sglang_guard.sglang.shell.release import interpreter_path
from support.sites import site_with


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _banner(tmp: Path, monkeypatch: pytest.MonkeyPatch, *extra: Path) -> None:
    """A sitecustomize that prints before anything else (as a conda hook or banner does)."""
    hook = tmp / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "print('Welcome to the cluster! [\"not\", \"the\", \"answer\"]')\n"
        "print('@@ partial line')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), *map(str, extra)]))


def test_a_banner_before_the_answer_is_ignored(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    site = site_with(tmp_path, "0.5.18")
    _banner(tmp_path, monkeypatch, site)
    path = interpreter_path(sys.executable)
    assert str(site) in path and not any("Welcome" in p for p in path)
    release = resolve_release(version=None, version_source="", python=sys.executable)
    assert release.version == "0.5.18"


def test_a_failed_probe_is_exit_2_with_the_interpreters_stderr(tmp_path: Path) -> None:
    broken = _script(tmp_path / "python", "import sys\nprint('banner only')\n"
                     "sys.stderr.write('Fatal Python error: init_fs_encoding: broken env\\n')\n"
                     "sys.exit(1)\n")
    with pytest.raises(InputError, match=r"exit 1.*init_fs_encoding: broken env"):
        interpreter_path(broken)
    res = CliRunner().invoke(main, ["check", "--python", broken, "--", "--model-path", "/m"])
    assert res.exit_code == EXIT_USAGE
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("sglang-guard: error: ") and "broken env" in line


def test_a_probe_without_an_answer_is_exit_2(tmp_path: Path) -> None:
    silent = _script(tmp_path / "python", "print('I am not python')\n")
    with pytest.raises(InputError, match="I am not python"):
        interpreter_path(silent)


def test_no_sglang_is_exit_69_naming_the_interpreter_and_its_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _banner(tmp_path, monkeypatch, tmp_path / "empty")
    with pytest.raises(SglangMissing) as err:
        resolve_release(version=None, version_source="", python=sys.executable)
    assert err.value.exit_code == EXIT_ENVIRONMENT
    assert sys.executable in str(err.value) and str(tmp_path / "empty") in str(err.value)


def test_run_without_sglang_gives_69_after_one_probe(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls.jsonl"
    counted = _script(tmp_path / "python", (
        "import json, os, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("SGLANG_GUARD_STATUS_LISTEN", "off")  # no default port
    res = CliRunner().invoke(main, ["run", "--python", counted, "--state-dir",
                                    str(tmp_path / "state"), "--", "--model-path", "/m",
                                    "--port", "1"])
    assert res.exit_code == EXIT_ENVIRONMENT, res.output
    probes = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(probes) == 1 and probes[0][0] == "-c"  # the probe; no launch followed
    assert counted in res.stderr and "has no SGLang" in res.stderr
