"""Issue 19 item 6 on the H200 record: the guarded runs that relaunched the same command line
on the real GPU (before the repeat check) now end after two launches, with the crash's line.

Each launch of the fake SGLang prints what real SGLang 0.5.17 printed in that launch on the
H200 (tests/data/h200-gpu-0.5.17-logs.tar.xz, `superseded/`, the guard's own JSON records left
out). tests/data/h200-gpu-0.5.17-superseded.jsonl keeps what the first session's guard did
then: 4 identical launches and exit 75 after ~250-300 s. The second session ran every guarded
line again on the H200 with the current guard (the record itself, checked by
tests/unit/test_h200_gpu_record.py): the same three lines, without preflight, end after two
launches there too.
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.errors import EXIT_GIVE_UP
from sglang_guard.rules.rules import Matcher, load_default_packs
from support.harness import HealthServer, Launcher, journal_events, make_runtime, supervise

DATA = Path(__file__).resolve().parents[1] / "data"
ROWS = [json.loads(x) for x in
        (DATA / "h200-gpu-0.5.17-superseded.jsonl").read_text().splitlines() if x]
LOOPS = [r for r in ROWS if r["mode"] != "plain" and r["guard"]["restarts_same_argv"] > 1]


def _launches(name: str) -> tuple[list[str], list[list[str]]]:
    """(the first launch's argv, SGLang's own lines of each launch) from a recorded log."""
    with tarfile.open(DATA / "h200-gpu-0.5.17-logs.tar.xz") as tf:
        fh = tf.extractfile(name)
        assert fh is not None
        text = fh.read().decode("utf-8", "replace")
    argv: list[str] = []
    launches: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "child.start" and "pid" in record:
                launches.append([])
            if record.get("argv") and not argv:
                argv = list(record["argv"])
            continue
        if launches:
            launches[-1].append(line)
    return argv, launches


def _plan(lines: list[str]) -> list[list[Any]]:
    return [*(["print", "stderr", ln] for ln in lines), ["sleep", 0.3], ["exit", 1]]


def test_the_record_holds_the_crash_loops() -> None:
    assert len(LOOPS) == 3 and all(r["guard"]["launches"] == 4 for r in LOOPS)


@pytest.mark.parametrize("row", LOOPS, ids=lambda r: r["id"])
def test_a_recorded_crash_loop_now_ends_after_two_launches(row: dict[str, Any],
                                                           tmp_path: Path) -> None:
    argv, launches = _launches(row["log"])
    assert len(launches) == 4
    with HealthServer() as server:
        argv = [*argv, "--port", str(server.port)]
        launcher = Launcher(tmp_path, [_plan(lines) for lines in launches])
        # a crash-loop budget that alone would allow every recorded launch again
        rt = make_runtime(tmp_path, launcher, max_failures=10)
        rt = replace(rt, env=replace(rt.env, matcher=Matcher(load_default_packs()),
                                     sglang_version="0.5.17", sm=90))
        code = supervise(rt, argv)
    assert code == EXIT_GIVE_UP
    assert len(launcher.argvs()) == 2
    records = journal_events(tmp_path / "state")
    reason = next(r["reason"] for r in records if r["event"] == "guard.exit")
    # the crash's own exception line (as SGLang printed it in both launches) is the reason
    last = [ln for ln in launches[0] if ln and not ln.startswith((" ", "["))]
    assert any(ln.split(":")[0] in reason for ln in last), reason
