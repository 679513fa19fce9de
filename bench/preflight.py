"""Whole-process timings of `sglang-guard check`, against its peers in the same run.

    python bench/preflight.py [--runs 5] [--sglang-python PATH]

Prints medians (and min/max) of: reading config.json in a fresh interpreter (the floor),
`import transformers` alone, `AutoConfig.from_pretrained` as a whole process, `check` with no
cached facts (nor the backend table's decoded copy: the whole cache is emptied), `check` with
them cached, and (with --sglang-python) real SGLang failing on the same bad command line.
Bytecode is written and warm first (an installed guard has its .pyc files, whatever
PYTHONDONTWRITEBYTECODE says here). Targets (issue 24): cold <= 0.5 s, cached <= 0.1 s,
median of 5, whole process. The load average is printed with the figures: on a shared
machine the ratios to the peers measured in the same run are what counts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "configs" / "models" / "tiny-llama"
BAD = ["--model-path", str(MODEL), "--attention-backend", "cutedsl_mla"]
BAD_LATE = [
    "--model-path",
    str(REPO / "configs" / "models" / "tiny-deepseek-v3"),
    "--attention-backend",
    "hpc_ops",
]


def timed(cmd: list[str], env: dict[str, str], before: object = None) -> float:
    """Seconds one run of `cmd` takes (exit status ignored: `check` exits 1 when it fixes)."""
    if callable(before):
        before()
    start = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def row(name: str, samples: list[float], target: str = "") -> None:
    med = statistics.median(samples)
    print(
        f"{name:<44} median {med:7.3f} s   min {min(samples):7.3f}   max {max(samples):7.3f}"
        f"   {target}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sglang-python", default=os.environ.get("SGLANG_GUARD_SGLANG_PYTHON"))
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="bench-facts-")
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        "SGLANG_GUARD_CACHE": cache,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    py = sys.executable
    guard = [py, "-m", "sglang_guard", "check", "--gpu-sm", "auto", "--", *BAD]
    clear = lambda: shutil.rmtree(cache, ignore_errors=True)  # noqa: E731
    n = args.runs
    timed(guard, env)  # bytecode written, files in the page cache
    print(
        f"# {os.cpu_count()} cores, python {sys.version.split()[0]}, {n} runs each, model {MODEL.name}"
        f"; load average {load()}"
    )
    floor = [
        timed([py, "-c", f"import json; json.load(open({str(MODEL / 'config.json')!r}))"], env)
        for _ in range(n)
    ]
    row("read config.json (python -c)", floor)
    row(
        "import transformers (python -c)",
        [timed([py, "-c", "import transformers"], env) for _ in range(n)],
    )
    auto = [
        timed(
            [
                py,
                "-c",
                f"from transformers import AutoConfig; AutoConfig.from_pretrained({str(MODEL)!r})",
            ],
            env,
        )
        for _ in range(n)
    ]
    row("AutoConfig.from_pretrained (python -c)", auto)
    cold = [timed(guard, env, clear) for _ in range(n)]
    row("sglang-guard check, no cached facts", cold, "target <= 0.5 s")
    warm = [timed(guard, env) for _ in range(n)]
    row("sglang-guard check, facts cached", warm, "target <= 0.1 s")
    # Issue "Every SGLang release": the same check decided for other releases (their option,
    # backend and arch tables replayed from configs/sglang/releases.json).
    for version in ("0.5.23", "0.5.18", "0.5.1"):
        pinned = [py, "-m", "sglang_guard", "check", "--gpu-sm", "auto",
                  "--sglang-version", version, "--", *BAD]
        row(f"check --sglang-version {version}, cold", [timed(pinned, env, clear) for _ in range(n)],
            "target <= 0.5 s")
        row(f"check --sglang-version {version}, cached", [timed(pinned, env) for _ in range(n)],
            "target <= 0.1 s")
    print(
        f"{'ratio cold check / AutoConfig process':<44} {statistics.median(cold) / statistics.median(auto):7.2f}x"
    )
    print(
        f"{'ratio cached check / read config.json':<44} {statistics.median(warm) / statistics.median(floor):7.2f}x"
    )
    if args.sglang_python:
        cpu = [
            "--device",
            "cpu",
            "--load-format",
            "dummy",
            "--skip-tokenizer-init",
            "--max-total-tokens",
            "4096",
            "--port",
            "0",
        ]
        sg = [args.sglang_python, "-m", "sglang.launch_server"]
        fail = [timed([*sg, *BAD, *cpu], env) for _ in range(min(n, 2))]
        row("real SGLang failing on the same command", fail, "(GPU check, argument phase)")
        late = [timed([*sg, *BAD_LATE, *cpu], env) for _ in range(min(n, 2))]
        row("real SGLang: hpc_ops on tiny DeepSeek-V3", late, "(arch check, after model init)")
        guard_late = [
            timed([py, "-m", "sglang_guard", "check", "--", *BAD_LATE], env) for _ in range(n)
        ]
        row("sglang-guard check on that command, cached", guard_late)
        print(
            f"{'ratio SGLang failure / cached check':<44} "
            f"{statistics.median(fail) / statistics.median(warm):7.0f}x .. "
            f"{statistics.median(late) / statistics.median(guard_late):.0f}x"
        )
    else:
        print("(pass --sglang-python to time real SGLang failing on the same command line)")
    print(f"# load average at the end {load()}")
    clear()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
