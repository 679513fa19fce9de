"""The OOM ladder on an older release: every fix is a flag that release's parser takes.

A fake SGLang 0.5.12 (`[sglang] version`) fails CUDA-graph capture out of memory until CUDA
graphs are off. 0.5.12 has no --cuda-graph-max-bs-decode and no --cuda-graph-backend-decode:
the guard must walk the ladder in 0.5.12's own flags and never launch what 0.5.12 rejects.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from sglang_guard.errors import EXIT_OK
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_release
from support.guards import Guard, finish
from support.harness import HEALTH_HOST, HealthServer, Launcher, count, ready_then_wait, wait_for

# The line SGLang 0.5.12 raises (cuda_graph_runner.py, "Capture cuda graph failed: {e}") with
# torch's OOM text as seen in public reports (tests/data/sglang-messages-0.5.23.toml has it).
OOM = ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 512.00 MiB."
       " GPU 0 has a total capacity of 79.19 GiB of which 301.06 MiB is free.")


def test_a_0_5_12_capture_oom_is_fixed_with_flags_0_5_12_accepts(
        tmp_path: Path, guard: Guard) -> None:
    crash = [["print", "stderr", "Traceback (most recent call last):"],
             ["print", "stderr", OOM], ["exit", 1]]
    launcher = Launcher(tmp_path, [crash] * 5 + [ready_then_wait()])
    config = tmp_path / "guard.toml"
    config.write_text("\n".join([
        "[sglang]", f"launch = {json.dumps(launcher.command)}", 'version = "0.5.12"',
        "[restart]", "max_failures = 2", "backoff_initial_s = 0.01", "stop_grace_s = 2.0",
        "[health]", f'host = "{HEALTH_HOST}"', "timeout_s = 2.0",
        "[gpu]", 'sm = "none"', "[log]", 'format = "json"']) + "\n")
    state = tmp_path / "state"
    with HealthServer() as server:
        proc = guard(config, ["--model-path", "/models/fake", "--port", str(server.port)],
                     state_dir=state)
        wait_for(lambda: count(state, "ready") == 1, 60, "ready after the ladder")
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc)
    assert code == EXIT_OK, err[-2000:]
    table = load_release("0.5.12").options
    argvs = launcher.argvs()
    assert len(argvs) == 6, argvs
    for argv in argvs:  # the release's own parser would take every launch
        problems = [o.problem for o in parse_command_line(tuple(argv), table).occurrences
                    if o.problem]
        assert problems == [], (argv, problems)
    last = argvs[-1]
    assert "--disable-cuda-graph" in last
    assert last[last.index("--cuda-graph-max-bs") + 1] == "8"  # 32 halved twice
    assert not any(t.startswith("--cuda-graph-max-bs-decode") or
                   t.startswith("--cuda-graph-backend") for t in last)
    assert count(state, "remediated") == 5
