"""The status port on real SGLang 0.5.23 (CPU): scrapes while loading, after ready, after a
log-path and a preflight remediation; a real Prometheus as the client; `sglang-guard serve`.

Every scrape is parsed by prometheus_client's own text parser. The rule ids and flags the
counters are checked for are read from the guard's journal (what the guard really did),
not assumed.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_guard.entry import GUARD_LINE
from sglang_guard.errors import EXIT_OK
from sglang_guard.status.shell.status import ENV_LISTEN
from sglang_guard.status.status import RESTART_CAUSES, action_label

from .guardproc import (
    GuardProc,
    guard_process,
    guard_run_cmd,
    post_generate,
    sglang_args,
    write_guard_toml,
)
from .models import write_tiny_llama
from .promserver import find_binary, prometheus
from .server import CPU_FLAGS, free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0
SHIPPED_LLAMA = Path(__file__).resolve().parents[2] / "configs" / "models" / "tiny-llama"
CUTEDSL = ("--attention-backend", "cutedsl_mla")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def scrape(port: int) -> Samples:
    """/metrics parsed by prometheus_client: (sample, labels) -> value."""
    code, body = _get(port, "/metrics")
    assert code == 200, body
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample; a KeyError names what is missing."""
    return samples[(name, frozenset(labels.items()))]


def phase(samples: Samples) -> str:
    """The one phase whose one-hot gauge is 1."""
    (name,) = [dict(labels)["phase"] for (n, labels), v in samples.items()
               if n == "sglang_guard_phase" and v == 1]
    return name


def _status_env(port: int) -> dict[str, str]:
    return {ENV_LISTEN: f"127.0.0.1:{port}"}


def _stop(guard: GuardProc) -> None:
    assert guard.terminate() == EXIT_OK, guard.describe()
    guard.assert_tree_gone()


def test_log_fix_scraped_while_loading_after_ready_and_by_prometheus(
        sglang_python: str, tmp_path: Path) -> None:
    """cutedsl_mla kills SGLang; the guard drops it from the log line; every stage scraped."""
    binary = find_binary()
    if binary is None:
        if os.environ.get("CI") or os.environ.get("SGLANG_GUARD_E2E") == "1":
            pytest.fail("prometheus is not installed (apt-get install prometheus)")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    status_port = free_port()
    toml = write_guard_toml(tmp_path / "guard.toml")
    cmd = guard_run_cmd(sglang_python, state, sglang_args(model, port, CUTEDSL),
                        options=["--no-preflight", "--config", str(toml)])
    with prometheus(binary, tmp_path / "prom", ("127.0.0.1", status_port)) as prom, \
            guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log",
                          env=_status_env(status_port)) as guard:
        guard.wait_event("child.start", 60)
        first = scrape(status_port)  # the first launch is loading
        assert phase(first) in ("starting", "loading"), first
        assert value(first, "sglang_guard_ready") == 0
        assert value(first, "sglang_guard_generation") == 1
        assert all(value(first, "sglang_guard_restarts_total", cause=c) == 0
                   for c in RESTART_CAUSES)

        guard.wait_event("child.start", READY_S, count=2)
        loading = scrape(status_port)  # fixed, relaunched, loading again
        fix = guard.events("remediated")[0]
        labels = {"trigger": "log", "rule": str(fix["rule"]), "flag": str(fix["flag"]),
                  "action": str(fix["action"])}
        assert labels["flag"] == "--attention-backend", fix
        if not guard.events("ready"):
            assert phase(loading) in ("starting", "loading"), loading
            assert value(loading, "sglang_guard_ready") == 0
        assert value(loading, "sglang_guard_remediations_total", **labels) == 1

        guard.wait_event("ready", READY_S)
        ready = scrape(status_port)
        assert phase(ready) == "ready"
        assert value(ready, "sglang_guard_ready") == 1
        assert value(ready, "sglang_guard_child_up") == 1
        assert value(ready, "sglang_guard_remediations_total", **labels) == 1
        assert value(ready, "sglang_guard_restarts_total", cause="fix") == 1
        assert value(ready, "sglang_guard_restarts_total", cause="crash") == 0
        assert value(ready, "sglang_guard_launches_total", reason="start") == 1
        assert value(ready, "sglang_guard_time_to_ready_seconds_count") == 1
        assert value(ready, "sglang_guard_time_to_ready_seconds_sum") > 0
        assert _get(status_port, "/readyz")[0] == 200
        assert _get(status_port, "/startupz")[0] == 200
        assert _get(status_port, "/livez")[0] == 200
        doc = json.loads(_get(status_port, "/status")[1])
        assert doc["sglang_version"] == "0.5.23"
        assert doc["last_remediation"]["rule"] == labels["rule"]
        assert post_generate(port).get("output_ids")

        # Prometheus, scraping every second, sees the same counter and the ready gauge.
        selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
        result = prom.wait_for(f"sglang_guard_remediations_total{{{selector}}} == 1", 60)
        assert result[0]["metric"]["rule"] == labels["rule"]
        assert prom.wait_for("sglang_guard_ready == 1", 60)[0]["value"][1] == "1"
        assert prom.query('sglang_guard_restarts_total{cause="fix"}')[0]["value"][1] == "1"
        _stop(guard)


def test_preflight_fix_is_counted_and_the_port_answers_during_preflight(
        sglang_python: str, tmp_path: Path) -> None:
    """Preflight drops cutedsl_mla before the only launch; the port is up before it."""
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    status_port = free_port()
    toml = write_guard_toml(tmp_path / "guard.toml")
    cmd = guard_run_cmd(sglang_python, state, sglang_args(model, port, CUTEDSL),
                        options=["--config", str(toml)])
    phases: list[str] = []

    def answered() -> bool:
        try:
            phases.append(phase(scrape(status_port)))
        except OSError:
            return False
        return True

    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log",
                       env=_status_env(status_port)) as guard:
        tick = threading.Event()  # never set: a 10 ms poll, tighter than guard.wait_until's
        deadline = time.monotonic() + 60
        while not answered() and time.monotonic() < deadline and guard.proc.poll() is None:
            tick.wait(0.01)
        assert phases, f"the status port never answered; {guard.describe()}"
        assert phases[-1] == "preflight", phases  # up before SGLang was launched
        guard.wait_event("ready", READY_S)
        m = scrape(status_port)
        fix = guard.events("remediated")[0]
        assert fix["trigger"] == "preflight", fix
        assert value(m, "sglang_guard_remediations_total", trigger="preflight",
                     rule=str(fix["rule"]), flag="--attention-backend",
                     action=action_label(str(fix["action"]))) == 1  # one label vocabulary
        assert value(m, "sglang_guard_launches_total", reason="start") == 1
        assert sum(value(m, "sglang_guard_restarts_total", cause=c) for c in RESTART_CAUSES) == 0
        assert value(m, "sglang_guard_ready") == 1
        _stop(guard)


def test_serve_runs_the_tiny_model_to_ready_as_sglang_serve(
        sglang_python: str, tmp_path: Path) -> None:
    """`sglang-guard serve MODEL …` with the shipped tiny Llama launches `sglang serve`."""
    model, port, state = SHIPPED_LLAMA, free_port(), tmp_path / "state"
    assert (model / "config.json").is_file()
    cmd = [sys.executable, "-m", "sglang_guard", "serve", str(model), *CPU_FLAGS,
           "--port", str(port)]
    env = {"SGLANG_GUARD_PYTHON": sglang_python, "SGLANG_GUARD_STATE_DIR": str(state),
           "SGLANG_GUARD_CONFIG": str(write_guard_toml(tmp_path / "guard.toml")),
           "SGLANG_GUARD_LOG_FORMAT": "json", ENV_LISTEN: "off"}
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log", env=env) as guard:
        guard.wait_event("ready", READY_S)
        main = _sglang_main(guard)
        assert main[0] == str(Path(sglang_python).with_name("sglang")), main
        assert main[1:4] == ["serve", "--model-path", str(model)], main
        assert post_generate(port).get("output_ids")
        _stop(guard)


def _sglang_main(guard: GuardProc) -> list[str]:
    """The command line of SGLang's main process (the guard's child)."""
    for proc in guard.observe():
        if proc.ppid() == guard.proc.pid:
            cmdline: list[str] = proc.cmdline()
            # a console script runs as `python /path/bin/sglang serve …`
            return cmdline[1:] if cmdline[0].endswith(("python", "python3")) or (
                "python" in Path(cmdline[0]).name) else cmdline
    raise AssertionError(f"no SGLang child of the guard; {guard.describe()}")


def test_serve_help_is_sglang_serves_help(sglang_python: str) -> None:
    out = subprocess.run([sys.executable, "-m", "sglang_guard", "serve", "--help"],
                         env={**os.environ, "SGLANG_GUARD_PYTHON": sglang_python},
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    assert "Usage: sglang serve <model-name-or-path>" in out.stdout
    assert "--attention-backend" in out.stdout  # the LLM server's own flags
    assert out.stdout.rstrip().endswith(GUARD_LINE.strip())
