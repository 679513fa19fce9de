"""Hostile or broken inputs: nested 100k deep, rejected by transformers, alias bombs, endless logs.

What must hold: exit 2 and one line on stderr (never 70, never a traceback), in bounded time
and memory; `explain` streams a huge line with bounded memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_USAGE
from support.guards import guard_toml
from support.harness import Launcher, ready_then_wait
from support.pack import FA3_LINE, PACK_TEXT
from support.procs import free_port

DEEP = 100_000
BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
model-path: /models/x
tp-size: [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def guard(*args: str, cwd: Path, timeout: float = 60) -> tuple[int, str, float]:
    """`sglang-guard ARGS` as a process: status, stderr, seconds."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sglang_guard", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL,
                          check=False)
    return done.returncode, done.stderr, time.monotonic() - started


def one_line(code: int, err: str, *needles: str) -> None:
    assert code == EXIT_USAGE, err
    lines = [x for x in err.splitlines() if x.strip()
             and not x.startswith("[transformers]")]  # transformers' own import notice
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def model_dir(tmp: Path, config: str) -> Path:
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text(config)
    return model


@pytest.fixture
def launcher_toml(tmp_path: Path) -> Path:
    """A guard config whose SGLang is the fake child (run: preflight on)."""
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    return guard_toml(tmp_path, Launcher(tmp_path, [ready_then_wait()]), pack)


def _run_args(config: Path, state: Path, *sglang: str) -> list[str]:
    return ["run", "--config", str(config), "--state-dir", str(state), "--gpu-sm", "none",
            "--", *sglang, "--port", str(free_port())]


@pytest.mark.parametrize("command", ["check", "run"])
def test_config_json_nested_100k_deep(tmp_path: Path, launcher_toml: Path, command: str) -> None:
    model = model_dir(tmp_path, '{"a": ' + "[" * DEEP + "]" * DEEP + "}")
    args = (["check", "--gpu-sm", "none", "--", "--model-path", str(model)]
            if command == "check" else
            _run_args(launcher_toml, tmp_path / "state", "--model-path", str(model)))
    code, err, _ = guard(*args, cwd=tmp_path)
    one_line(code, err, "nested deeper than")


@pytest.mark.parametrize("command", ["check", "run"])
def test_config_json_transformers_rejects(tmp_path: Path, launcher_toml: Path,
                                          command: str) -> None:
    model = model_dir(tmp_path, json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "num_attention_heads": 5}))
    args = (["check", "--gpu-sm", "none", "--", "--model-path", str(model)]
            if command == "check" else
            _run_args(launcher_toml, tmp_path / "state", "--model-path", str(model)))
    code, err, _ = guard(*args, cwd=tmp_path)
    one_line(code, err, "not a multiple")


@pytest.mark.parametrize("which", ["guard config", "rule pack"])
def test_toml_nested_100k_deep(tmp_path: Path, which: str) -> None:
    deep = "x = " + "[" * DEEP + "]" * DEEP + "\n"
    config = tmp_path / "guard.toml"
    if which == "guard config":
        config.write_text(deep)
    else:
        pack = tmp_path / "pack.toml"
        pack.write_text('[pack]\nname = "t"\n' + deep)
        config.write_text(f'[rules]\npacks = ["{pack}"]\n')
    code, err, _ = guard("explain", "--config", str(config), "-", cwd=tmp_path)
    one_line(code, err, "nested deeper than")


def test_billion_laughs_yaml_is_refused_at_once(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    code, err, seconds = guard("check", "--gpu-sm", "none", "--", "--config", str(bomb),
                               cwd=tmp_path, timeout=60)
    one_line(code, err, "alias")
    assert seconds < 20


def test_explain_of_a_device_is_refused(tmp_path: Path) -> None:
    code, err, seconds = guard("explain", "/dev/zero", cwd=tmp_path, timeout=60)
    one_line(code, err, "/dev/zero", "character device")
    assert seconds < 20


def test_explain_of_one_300_mb_line_streams_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "huge.log"
    with log.open("wb") as fh:
        block = b"x" * (1 << 20)
        for _ in range(300):
            fh.write(block)
        fh.write(b"\n" + FA3_LINE.encode() + b"\n")
    # measured in a fresh parent, so no earlier child's peak counts
    probe = ("import resource, subprocess, sys; "
             "p = subprocess.run([sys.executable, '-m', 'sglang_guard', 'explain', '--json', "
             f"{str(log)!r}], capture_output=True, text=True); "
             "print(p.returncode); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
             "print(p.stdout)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n", 2)
    code, max_rss_kib, stdout = int(out[0]), int(out[1]), out[2]
    assert code == 0, stdout
    assert max_rss_kib < 150 * 1024, f"explain peaked at {max_rss_kib // 1024} MiB"
    lines = [m["line_no"] for m in json.loads(stdout)["matches"]]
    assert 2 in lines
