"""Secrets at rest and in every output: derived YAML modes, the journal, stderr, `explain`.

A run with preflight on (the fake child as SGLang, a tiny Llama dir as the model) whose user
YAML holds `api-key:` and a backend that preflight drops, so a derived copy is written; the
fatal line, the URL and the JSON flag all carry secrets that must never be stored or shown.
"""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.errors import EXIT_OK
from sglang_guard.supervise.machine import READY_LINE
from support.guards import guard_toml
from support.harness import HealthServer, Launcher, journal_events, ready_then_wait, wait_for
from support.models import write_llama
from support.pack import FA3_LINE, PACK_TEXT

SECRETS = ("sk-abcdefgh12345678", "PASS1234", "AKIAVERYSECRET", "s3cr3tvalue", "hf_abcdefghijklmn")
URL = "https://bob:PASS1234@collector.example:4317"
JSON_FLAG = '{"secret_access_key": "AKIAVERYSECRET", "bucket": "b"}'
LINE = f"{FA3_LINE} api_key='s3cr3tvalue' token=hf_abcdefghijklmn"


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    """The test rule pack as a file."""
    path = tmp_path / "rules.toml"
    path.write_text(PACK_TEXT)
    return path


def _ready_after_fix(state: Path) -> bool:
    """A launch after the log fix is ready: the derived YAML (written for the relaunch) is
    there. Gen 1's own ready line may be journaled before its fatal line (two pipes): that
    ready and the fix alone came before the relaunch wrote it (CI failed so once)."""
    events = journal_events(state)
    fixed = [r["gen"] for r in events if r["event"] == "remediated"]
    return bool(fixed) and any(r["event"] == "ready" and r["gen"] > fixed[0] for r in events)


def test_secrets_stay_masked_and_derived_files_private(tmp_path: Path, pack: Path) -> None:
    model = write_llama(tmp_path / "model")
    user_yaml = tmp_path / "sglang.yaml"
    user_yaml.write_text(f"model-path: {model}\nattention-backend: cutedsl_mla\n"
                         f"api-key: {SECRETS[0]}\n")
    user_yaml.chmod(0o400)  # stricter than 0600: the derived copy takes this mode
    launcher = Launcher(tmp_path, [
        [["print", "stdout", READY_LINE], ["print", "stderr", LINE], ["wait_term"], ["exit", 0]],
        ready_then_wait(),
    ])
    state = tmp_path / "state"
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, max_failures=3, stop_grace_s=0.5)
        argv = ["--config", str(user_yaml), "--port", str(server.port),
                "--otlp-traces-endpoint", URL,
                "--hicache-storage-backend-extra-config", JSON_FLAG,
                "--attention-backend", "fa3"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
             "--gpu-sm", "90", "--state-dir", str(state), "--", *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            cwd=tmp_path)
        try:
            wait_for(lambda: _ready_after_fix(state), what="ready after the log fix")
            derived = list((state / "derived").glob("*.yaml"))
            assert derived, "preflight wrote no derived YAML"
            assert stat.S_IMODE((state / "derived").stat().st_mode) == 0o700
            for path in derived:
                assert stat.S_IMODE(path.stat().st_mode) == 0o400, path
            assert stat.S_IMODE((state / "journal.jsonl").stat().st_mode) == 0o600
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_OK, err.decode()
    journal = (state / "journal.jsonl").read_text()
    stored = [r for r in map(json.loads, journal.splitlines()) if r.get("trigger") == "log"]
    assert stored and "***" in stored[0]["line"]
    # stderr carries SGLang's own lines raw (byte-exact pass-through): only the guard's events
    events = "\n".join(x for x in err.decode().splitlines() if x.startswith('{"'))
    assert '"remediated"' in events or '"trigger": "log"' in events
    for secret in SECRETS:
        assert secret not in journal, f"{secret} stored in the journal"
        assert secret not in events, f"{secret} in the guard's events on stderr"
    assert "bob" not in journal


def test_explain_masks_what_it_prints(tmp_path: Path, pack: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"starting with --otlp-traces-endpoint {URL}\n{LINE}\n")
    guard = tmp_path / "guard.toml"
    guard.write_text(f'[rules]\ndefault_pack = false\npacks = ["{pack}"]\n')
    for args in (["explain", "--all", str(log)], ["explain", "--json", str(log)]):
        res = CliRunner().invoke(main, [args[0], "--config", str(guard), *args[1:]])
        assert res.exit_code == 0, res.output
        assert "fa3" in res.output or "FlashAttention" in res.output
        for secret in SECRETS:
            assert secret not in res.output, res.output
