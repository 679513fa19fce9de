"""`run` never launches what the release's parser rejects (issue 19, item 3).

With preflight: exit 2 at once, nothing launched, the flag named on stderr, in the journal
and in the termination log. With --no-preflight: one launch, then SGLang's own argparse exit
(status 2, its usage line) ends the guard with 2, never a crash loop.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sglang_guard.errors import EXIT_USAGE
from support.harness import Launcher, journal_events
from support.procs import free_port

USAGE = "usage: sglang serve [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH]"
ERROR = "sglang serve: error: unrecognized arguments: --attention-backendd triton"


def _toml(tmp: Path, launcher: Launcher, version: str | None = None) -> Path:
    """The default rule pack, the fake launcher as SGLang, a termination log file."""
    path = tmp / "guard.toml"
    path.write_text("\n".join([
        "[sglang]", f"launch = {json.dumps(launcher.command)}",
        *([f'version = "{version}"'] if version else []),
        "[restart]", "max_failures = 5", "backoff_initial_s = 0.01", "backoff_max_s = 0.05",
        "stop_grace_s = 2.0",
        "[status]", 'listen = "off"', f"termination_log = {json.dumps(str(tmp / 'term.log'))}",
        "[gpu]", 'sm = "none"', "[log]", 'format = "json"']) + "\n")
    return path


def _run(tmp: Path, launcher: Launcher, argv: list[str], *more: str,
         version: str | None = None) -> tuple[int, str]:
    config = _toml(tmp, launcher, version)
    cmd = [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
           "--state-dir", str(tmp / "state"), *more, "--", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp,
                          stdin=subprocess.DEVNULL, check=False)
    return proc.returncode, proc.stderr


def _llama(tmp: Path) -> str:
    model = tmp / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
        "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 2048}))
    return str(model)


def test_a_rejected_line_is_never_launched(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [[["print", "stdout", "launched"], ["exit", 0]]])
    argv = ["--model-path", _llama(tmp_path), "--port", str(free_port()),
            "--attention-backendd", "triton"]
    code, err = _run(tmp_path, launcher, argv)
    assert code == EXIT_USAGE, err
    assert launcher.argvs() == []  # nothing launched
    last = err.strip().splitlines()[-1]
    assert last.startswith("sglang-guard: error: ") and "--attention-backendd" in last
    assert "unrecognized arguments: --attention-backendd triton" in last
    records = journal_events(tmp_path / "state")
    refusal = next(r for r in records if r["event"] == "preflight.refuse")
    assert refusal["flag"] == "--attention-backendd" and refusal["rule"] == "compat.parser"
    assert records[-1]["event"] == "guard.exit" and records[-1]["code"] == EXIT_USAGE
    assert "--attention-backendd" in (tmp_path / "term.log").read_text()


def test_without_preflight_the_first_argparse_exit_ends_the_guard(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [[["print", "stderr", USAGE], ["print", "stderr", ERROR],
                                    ["exit", 2]]])
    argv = ["--model-path", "/models/fake", "--port", str(free_port()),
            "--attention-backendd", "triton"]
    code, err = _run(tmp_path, launcher, argv, "--no-preflight")
    assert code == EXIT_USAGE, err
    assert len(launcher.argvs()) == 1  # one launch, no crash loop
    records = journal_events(tmp_path / "state")
    assert [r["event"] for r in records].count("child.start") == 1
    give_up = next(r for r in records if r["event"] == "give_up")
    assert "unrecognized arguments: --attention-backendd triton" in give_up["reason"]
    assert records[-1]["event"] == "guard.exit" and records[-1]["code"] == EXIT_USAGE
    assert "--attention-backendd" in (tmp_path / "term.log").read_text()


def test_a_release_without_the_draft_flag_is_launched(tmp_path: Path) -> None:
    # 0.5.3 has no --speculative-draft-attention-backend: preflight decides (was: KeyError,
    # exit 70 before any launch), the line is launched; the fake SGLang then rejects it.
    launcher = Launcher(tmp_path, [[["print", "stderr", USAGE], ["print", "stderr", ERROR],
                                    ["exit", 2]]])
    argv = ["--model-path", _llama(tmp_path), "--port", str(free_port()),
            "--attention-backend", "triton"]
    code, err = _run(tmp_path, launcher, argv, version="0.5.3")
    assert code == EXIT_USAGE, err
    assert launcher.argvs() == [argv]
    assert "internal error" not in err
