"""`sglang-guard check` as a whole process, cold (no cached model facts) and cached.

Peers in the same run: reading config.json in a fresh interpreter (the floor any Python tool
pays), `AutoConfig.from_pretrained` as a process (what a cold check must at least do, the
normal way), and the same process importing transformers the guard's way (modelprobe's bare
packages: the floor of a cold check, whose forked child does just that, warmprobe.py). Median of `runs` (at least 5) each. Bytecode is written and warm first:
an installed guard has its .pyc files, whatever PYTHONDONTWRITEBYTECODE says here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from measure import REPO, Figure

MODEL = REPO / "configs" / "models" / "tiny-llama"
ARGV = ["--model-path", str(MODEL), "--attention-backend", "cutedsl_mla"]
TARGETS = {"cold": 0.5, "cached": 0.1}  # issue 24, seconds (median of 5, whole process)


INSTRUCTIONS_NOTE = ("valgrind --tool=callgrind, one whole process each: the same count "
                     "to ~1% from run to run, where a 2-core VM's wall time swings 30-50% "
                     "between windows")


def _instructions(check: list[str], floor: list[str], env: dict[str, str]
                  ) -> tuple[float, float] | None:
    """Millions of instructions of a cached check and of its floor, counted by callgrind
    (None without valgrind, or when it counts nothing): ~5 s a check under it."""
    if shutil.which("valgrind") is None:
        return None
    counts = []
    for cmd in (check, floor):
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                               *cmd], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            return None
        counts.append(int(found.group(1)) / 1e6)
    print(f"  check cached {counts[0]:.1f}M instructions, floor {counts[1]:.1f}M",
          file=sys.stderr)
    return counts[0], counts[1]


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)
    return time.perf_counter() - start


def _must_work(check: list[str], auto: list[str], env: dict[str, str]) -> None:
    """Time only what works: `check` must give its decision (JSON with a final command line)
    and AutoConfig must load the config; an error exit is fast and would read as a figure
    (transformers missing, say: the H200 bench's venv has none)."""
    done = subprocess.run([*check[:4], "--json", *check[4:]], env=env, capture_output=True,
                          text=True, check=False)
    try:
        decision = json.loads(done.stdout)
    except ValueError:
        decision = None
    if not isinstance(decision, dict) or "argv_out" not in decision:
        raise RuntimeError(f"check gives no decision here (exit {done.returncode}): "
                           f"{done.stderr.strip()[-300:]}")
    loaded = subprocess.run(auto, env=env, capture_output=True, text=True, check=False)
    if loaded.returncode != 0:
        raise RuntimeError(f"AutoConfig does not load here: {loaded.stderr.strip()[-300:]}")


def measure(tmp: Path, runs: int) -> list[Figure]:
    """Cold and cached check against the two peer processes."""
    cache = tmp / "check-cache"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(SGLANG_GUARD_CACHE=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    py = sys.executable
    check = [py, "-m", "sglang_guard", "check", "--gpu-sm", "auto", "--", *ARGV]
    floor = [py, "-c", f"import json; json.load(open({str(MODEL / 'config.json')!r}))"]
    auto = [py, "-c", f"from transformers import AutoConfig; "
                      f"AutoConfig.from_pretrained({str(MODEL)!r})"]
    fast = [py, "-c", "from sglang_guard.preflight.shell import modelprobe as m; "
                      f"m._classes()[0][0].from_pretrained({str(MODEL)!r})"]
    for cmd in (check, auto, fast):  # bytecode written, files in the page cache
        _timed(cmd, env)
    _must_work(check, auto, env)
    _must_work(check, fast, env)
    got: dict[str, list[float]] = {k: [] for k in ("cold", "cached", "floor", "auto", "fast")}
    for run in range(runs):
        shutil.rmtree(cache, ignore_errors=True)
        got["cold"].append(_timed(check, env))
        got["cached"].append(_timed(check, env))
        got["floor"].append(_timed(floor, env))
        got["auto"].append(_timed(auto, env))
        got["fast"].append(_timed(fast, env))
        print(f"  check run {run + 1} cold {got['cold'][-1]:.3f} s  cached "
              f"{got['cached'][-1]:.3f} s  floor {got['floor'][-1]:.3f} s  AutoConfig "
              f"{got['auto'][-1]:.3f} s  the guard's way {got['fast'][-1]:.3f} s",
              file=sys.stderr)
    counted = _instructions(check, floor, env)  # the cache is warm: the cached check
    shutil.rmtree(cache, ignore_errors=True)
    figures = []
    for kind, peer, peer_name in (("cold", "auto", "AutoConfig.from_pretrained process"),
                                  ("cold", "fast", "that process, the guard's import"),
                                  ("cached", "floor", "python -c json.load(config.json)"),
                                  ("cold", "floor", "python -c json.load(config.json)")):
        limit = TARGETS[kind]
        fig = Figure(f"check, {kind}", "s", peer_name, "lower",
                     f"<= {limit:g} s median" if peer == "auto" or kind == "cached" else "",
                     guard=got[kind], peer=got[peer],
                     note=f"model {MODEL.name}, --gpu-sm auto, median of {runs}")
        if fig.target:
            fig.met = statistics.median(fig.guard) <= limit
        figures.append(fig)
    if counted is not None:
        figures.append(Figure("check, cached, instructions", "M instr", "python -c "
                              "json.load(config.json)", "lower", guard=[counted[0]],
                              peer=[counted[1]], note=INSTRUCTIONS_NOTE))
    return figures
