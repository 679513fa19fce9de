"""The status port against the real loop and the fake child: every scrape parsed by
prometheus_client's own text parser."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_guard.common.outcomes import BackingOff, ChildStarted, Ready
from sglang_guard.config.guardconfig import HealthSection, StatusSection
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK, Refused
from sglang_guard.preflight.preflight import Decision, Finding
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.status import status as model
from sglang_guard.status.shell.status import StatusBoard, serving
from sglang_guard.supervise.events import SignalReceived
from sglang_guard.supervise.shell.runner import journal_preflight
from sglang_guard.supervise.shell.supervisor import Supervisor
from support.guards import guard_toml
from support.harness import (
    HEALTH_HOST,
    HealthServer,
    Launcher,
    base_argv,
    count,
    make_runtime,
    ready_then_wait,
    supervise,
    wait_for,
)
from support.pack import FA3_LINE, GIVE_UP_LINE, PACK_TEXT
from support.procs import free_port
from support.statusport import get

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(address: tuple[str, int]) -> Samples:
    """/metrics, parsed by prometheus_client: (sample name, labels) -> value."""
    code, body = get(address, "/metrics")
    assert code == 200
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; KeyError when it is not exposed at all."""
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def board(tmp_path: Path) -> Iterator[StatusBoard]:
    """A status port on a free loopback port, with a termination-log file."""
    section = StatusSection(listen="127.0.0.1:0", termination_log=str(tmp_path / "term.log"))
    with serving(section) as board:
        yield board


def test_counters_are_registered_at_zero_before_anything_runs(board: StatusBoard) -> None:
    assert board.address is not None
    samples = scrape(board.address)
    for reason in model.LAUNCH_REASONS:
        assert value(samples, "sglang_guard_launches_total", reason=reason) == 0
    for cause in model.RESTART_CAUSES:
        assert value(samples, "sglang_guard_restarts_total", cause=cause) == 0
    for reason in model.GIVE_UP_REASONS:
        assert value(samples, "sglang_guard_give_ups_total", reason=reason) == 0
    for outcome in model.RELOAD_OUTCOMES:
        assert value(samples, "sglang_guard_reloads_total", outcome=outcome) == 0
    assert [p for p in model.PHASES if value(samples, "sglang_guard_phase", phase=p)] == [
        "preflight"]
    assert value(samples, "sglang_guard_ready") == 0
    assert value(samples, "sglang_guard_time_to_ready_seconds_count") == 0
    assert get(board.address, "/livez")[0] == 200  # preflight runs on the guard's thread
    assert get(board.address, "/readyz")[0] == 503
    assert get(board.address, "/startupz")[0] == 503  # until SGLang is ready
    assert get(board.address, "/nope")[0] == 404


def test_a_log_fix_counts_a_remediation_and_a_fix_restart_then_ready(
        tmp_path: Path, server: HealthServer, board: StatusBoard) -> None:
    assert board.address is not None
    address = board.address
    launcher = Launcher(tmp_path, [[["print", "stderr", FA3_LINE], ["exit", 1]],
                                   ready_then_wait()])
    rt = replace(make_runtime(tmp_path, launcher), observer=board)
    seen: dict[str, Any] = {}

    def during(sup: Supervisor) -> None:
        wait_for(lambda: count(tmp_path / "state", "ready") >= 1, what="ready")
        seen["metrics"] = scrape(address)
        seen["readyz"] = get(address, "/readyz")[0]
        seen["livez"] = get(address, "/livez")[0]
        seen["status"] = json.loads(get(address, "/status")[1])
        sup.events.put(SignalReceived(signal.SIGTERM))

    argv = base_argv(server.port, "--attention-backend", "fa3", "--api-key", "s3cret-key")
    assert supervise(rt, argv, during) == EXIT_OK
    m = seen["metrics"]
    assert value(m, "sglang_guard_remediations_total", trigger="log", rule="fa3-sm",
                 flag="--attention-backend", action="drop_flag") == 1
    # the other fix rule of the pack is there at zero
    assert value(m, "sglang_guard_remediations_total", trigger="log", rule="draft-triton",
                 flag="--speculative-draft-attention-backend", action="set_flag") == 0
    assert value(m, "sglang_guard_restarts_total", cause="fix") == 1
    assert value(m, "sglang_guard_restarts_total", cause="crash") == 0
    assert value(m, "sglang_guard_launches_total", reason="start") == 1
    assert value(m, "sglang_guard_launches_total", reason="fix") == 1
    assert value(m, "sglang_guard_ready") == 1
    assert value(m, "sglang_guard_phase", phase="ready") == 1
    assert value(m, "sglang_guard_child_up") == 1
    assert value(m, "sglang_guard_generation") == 2
    assert value(m, "sglang_guard_time_to_ready_seconds_count") == 1
    assert (seen["readyz"], seen["livez"]) == (200, 200)
    doc = seen["status"]
    assert (doc["phase"], doc["generation"], doc["ready"]) == ("ready", 2, True)
    assert doc["last_remediation"]["rule"] == "fa3-sm"
    assert doc["last_remediation"]["flag"] == "--attention-backend"
    assert "--attention-backend" in doc["last_remediation"]["argv_before"]
    assert "s3cret-key" not in json.dumps(doc)
    assert "***" in doc["argv"]
    after = scrape(address)  # the loop is done: stopped, nothing up
    assert value(after, "sglang_guard_phase", phase="stopped") == 1
    assert value(after, "sglang_guard_child_up") == 0


def test_liveness_and_crash_restarts_by_cause_and_startupz_503_after_give_up(
        tmp_path: Path, server: HealthServer, board: StatusBoard) -> None:
    assert board.address is not None
    server.status["/health_generate"] = 503
    launcher = Launcher(tmp_path, [ready_then_wait(), [["exit", 3]], [["exit", 3]]])
    health = HealthSection(host=HEALTH_HOST, timeout_s=2.0, liveness_interval_s=0.05,
                           liveness_failures=2)
    rt = replace(make_runtime(tmp_path, launcher, health=health, max_failures=3, window_s=60.0),
                 observer=board)
    assert get(board.address, "/startupz")[0] == 503  # not started yet
    assert supervise(rt, base_argv(server.port)) == EXIT_GIVE_UP
    m = scrape(board.address)
    assert value(m, "sglang_guard_restarts_total", cause="liveness") == 1
    assert value(m, "sglang_guard_restarts_total", cause="crash") == 1
    assert value(m, "sglang_guard_give_ups_total", reason="crash_loop") == 1
    assert value(m, "sglang_guard_ready") == 0
    code, body = get(board.address, "/startupz")
    assert code == 503
    assert json.loads(body)["gave_up"].startswith("crash loop: 3 failures")


def test_a_rule_give_up_writes_the_termination_message(tmp_path: Path) -> None:
    term = tmp_path / "term.log"
    launcher = Launcher(tmp_path, [[["print", "stderr", GIVE_UP_LINE], ["wait_term"],
                                    ["exit", 0]]])
    section = StatusSection(listen="127.0.0.1:0", termination_log=str(term))
    with serving(section) as board:
        rt = replace(make_runtime(tmp_path, launcher), observer=board)
        assert supervise(rt, base_argv(free_port())) == EXIT_GIVE_UP
        assert board.address is not None
        m = scrape(board.address)
        assert value(m, "sglang_guard_give_ups_total", reason="rule") == 1
        assert get(board.address, "/startupz")[0] == 503
    assert term.read_text() == "sglang-guard gave up: port-busy: the port is taken\n"


def test_a_refusal_writes_the_termination_message_and_counts(tmp_path: Path) -> None:
    term = tmp_path / "term.log"
    section = StatusSection(listen="127.0.0.1:0", termination_log=str(term))
    with pytest.raises(Refused), serving(section) as board:
        raise Refused("policy refused the command line: --attention-backend fa3: token=abc")
    assert term.read_text() == ("sglang-guard refused: policy refused the command line: "
                                "--attention-backend fa3: token=***\n")
    assert board.snapshot().gave_up is not None


def test_a_clean_exit_writes_no_termination_message(tmp_path: Path) -> None:
    term = tmp_path / "term.log"
    with serving(StatusSection(listen="off", termination_log=str(term))) as board:
        assert board.address is None
    assert not term.exists()


def test_preflight_remediations_are_counted_as_they_are_journaled(board: StatusBoard) -> None:
    assert board.address is not None
    finding = Finding(flag="--attention-backend", value="cutedsl_mla", action="drop",
                      new_value=None, reason="needs MLA", kind="arch")
    argv = ("--model-path", "/m", "--attention-backend", "cutedsl_mla")
    decision = Decision("remediated", argv, argv[:2], (finding,))
    journal_preflight(None, decision, load_option_table(), set(), board)  # no journal: counted
    m = scrape(board.address)
    assert value(m, "sglang_guard_remediations_total", trigger="preflight", rule="compat.arch",
                 flag="--attention-backend", action="drop_flag") == 1  # one vocabulary
    doc = json.loads(get(board.address, "/status")[1])
    assert doc["last_remediation"]["trigger"] == "preflight"
    assert doc["phase"] == "preflight"


def test_a_stalled_stage_turns_startupz_503(board: StatusBoard) -> None:
    assert board.address is not None
    board.set_stage("weight loading")
    assert json.loads(get(board.address, "/status")[1])["stage"] == "weight loading"
    assert get(board.address, "/startupz")[0] == 503  # loading: not up yet
    board.stalled("weight loading")
    assert get(board.address, "/startupz")[0] == 503
    assert value(scrape(board.address), "sglang_guard_start_stalled") == 1


def test_the_cli_serves_the_port_while_it_runs_and_frees_it(
        tmp_path: Path, server: HealthServer) -> None:
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    launcher = Launcher(tmp_path, [ready_then_wait()])
    port = free_port()
    config = guard_toml(tmp_path, launcher, pack, status=f"127.0.0.1:{port}")
    cmd = [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
           "--state-dir", str(tmp_path / "state"), "--no-preflight", "--",
           *base_argv(server.port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: count(tmp_path / "state", "ready") >= 1, what="ready")
        m = wait_for(lambda: _ready_scrape(("127.0.0.1", port)), what="ready gauge")
        assert value(m, "sglang_guard_launches_total", reason="start") == 1
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_OK
    assert b"status.listening" in err
    with pytest.raises(OSError):
        get(("127.0.0.1", port), "/livez")


def _ready_scrape(address: tuple[str, int]) -> Samples | None:
    m = scrape(address)
    return m if value(m, "sglang_guard_ready") == 1 else None


def test_a_record_the_fold_cannot_read_never_stops_the_loop(board: StatusBoard) -> None:
    board.record(ChildStarted(gen="not a number", reason="", argv=[]))  # type: ignore[arg-type]
    board.record(BackingOff(delay_s=None, reason="", failures_in_window=1))  # type: ignore[arg-type]
    board.record(Ready(gen=1, argv=[]))
    assert board.snapshot().ready


def test_a_start_the_stage_watcher_finds_stalled_turns_startupz_503(
        tmp_path: Path, board: StatusBoard) -> None:
    """The two halves joined: the machine's stage watch (a silent distributed init) journals
    start.stalled, and the status port answers /startupz 503 and names the stage."""
    from requestlines import TS  # noqa: PLC0415 - the fake SGLang record prefix
    from sglang_guard.config.guardconfig import StartSection  # noqa: PLC0415

    assert board.address is not None
    address = board.address
    # The stalled launch outlives its stop's SIGTERM until the test has read the port: the
    # guard sends it before it journals start.stalled, and the launch's end would then race
    # the reads below (its exit clears the stage).
    read = tmp_path / "read"
    launcher = Launcher(tmp_path, [[["print", "stderr", f"{TS} Init parallel begin."],
                                    ["ignore_term"], ["wait_file", str(read)], ["exit", 0]],
                                   [["pause"]]])
    rt = replace(make_runtime(tmp_path, launcher, stop_grace_s=30.0, max_failures=5),
                 observer=board)
    rt.env = replace(rt.env, start=StartSection(init_s=30.0, dist_init_s=1.0,
                                                on_stall="restart"))
    seen: dict[str, Any] = {}

    def during(sup: Supervisor) -> None:
        assert get(address, "/startupz")[0] == 503  # loading, within its limit: not up yet
        wait_for(lambda: count(tmp_path / "state", "start.stalled") >= 1, what="a stall")
        seen["startupz"] = get(address, "/startupz")[0]
        seen["status"] = json.loads(get(address, "/status")[1])
        read.touch()
        sup.events.put(SignalReceived(signal.SIGTERM))

    assert supervise(rt, base_argv(free_port()), during) == EXIT_OK
    assert seen["startupz"] == 503
    assert seen["status"]["stage"] in ("dist_init", "distributed init")


def test_a_loop_step_that_changes_nothing_touches_no_gauge(board: StatusBoard) -> None:
    """The hooks run on every loop step: only a changed snapshot sets the gauges."""
    shown: list[object] = []
    real = board.metrics.show
    board.metrics.show = lambda snap: (shown.append(snap), real(snap))[1]  # type: ignore[method-assign]
    state = SimpleNamespace(phase="starting")
    env = SimpleNamespace(sglang_version="0.5.23", matcher=SimpleNamespace(rules=()))
    board.stepped(state, env, [])  # type: ignore[arg-type]
    assert len(shown) == 1  # preflight -> starting
    for _ in range(100):
        board.stepped(state, env, [])  # type: ignore[arg-type]
    assert len(shown) == 1
    assert board.snapshot().phase == "starting"


def test_build_info_process_metrics_no_created_series_and_promtool_passes(
        board: StatusBoard) -> None:
    import shutil  # noqa: PLC0415

    from sglang_guard import __version__  # noqa: PLC0415

    assert board.address is not None
    m = scrape(board.address)
    assert value(m, "sglang_guard_build_info", version=__version__, sglang_version="unknown") == 1
    assert value(m, "process_open_fds") > 0
    assert value(m, "process_resident_memory_bytes") > 0
    assert not [name for name, _ in m if name.endswith("_created")]
    body = get(board.address, "/metrics")[1]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: .ci/run installs Debian's prometheus for it")
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
