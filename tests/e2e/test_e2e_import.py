"""Imported rule packs (`sglang-guard rules import`) as the ONLY pack, in front of real SGLang.

What the seed record can and cannot show on this test bed: its message,
`cutedsl_mla backend can only be used with MLA models.`, is raised when the attention
backend is created, and SGLang 0.5.23 checks the GPU before that: on CPU (and on any GPU but
SM100) `--attention-backend cutedsl_mla` fails earlier with `CuteDSL MLA backend is only
supported on Blackwell GPUs (SM100).`. So, with the tiny Llama and
`--no-preflight --attention-backend cutedsl_mla`:

- the seed pack alone fixes nothing here: the test checks that its rule loads in a real guard,
  stays quiet on the line that does appear (no remediation, no advice), and that the guard
  ends in a crash-loop give-up with the command line untouched;
- the fix itself goes through the import: a dataset of the seed plus one record written here
  for the message the CPU does print (from SGLang 0.5.23's own source, cited below), imported
  with `--sglang-src` (the installed release's source must hold both messages), drops the
  flag from the log line, restarts, and serves.

The seed's own rule acting on its own line is covered without SGLang, by
tests/unit/test_dataset.py (SGLang's line from tests/data/sglang-messages-0.5.23.toml).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK

from .guardproc import (
    guard_process,
    guard_run_cmd,
    post_generate,
    sglang_args,
    write_guard_toml,
)
from .models import write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0
CUTEDSL = ("--attention-backend", "cutedsl_mla")
CPU_MSG = "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)"
SEED = Path(__file__).resolve().parent.parent / "data" / "seed-error-record.json"
SEED_RULE = "cutedsl-mla-backend-can-only-be-used-with-mla-mode"
# Written for this test from sglang 0.5.23 (PyPI), sglang/srt/arg_groups/overrides.py:1245,
# `_cutedsl_prefill_backend_fill`; the fields the importer reads, in the seed's shape.
CPU_RECORD = {
    "id": "e2e-cutedsl-sm100", "repo": "sgl-project/sglang",
    "slug": "cutedsl-mla-backend-requires-sm100",
    "errorMessage": "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100). "
                    "Please use a different backend.",
    "messagePattern": r"CuteDSL MLA backend is only supported on Blackwell GPUs \(SM100\)\.",
    "errorType": "validation", "errorClass": "ValueError", "severity": "error",
    "filePath": "python/sglang/srt/arg_groups/overrides.py", "lineNumber": 1245,
    "analyzedSha": "v0.5.23 (PyPI)",
    "documentation": "The CuteDSL MLA decode backend runs only on SM100 GPUs.",
    "triggerScenarios": "--attention-backend cutedsl_mla on any platform but SM100.",
    "solutions": ["Drop the backend flag and let SGLang pick one for this GPU"],
    "exampleFix": "# before\n--model-path llama-3 --attention-backend cutedsl_mla\n"
                  "# after\n--model-path llama-3  # SGLang picks the backend\n",
    "preventionTips": ["Keep MLA-only, SM100-only backends out of shared launch scripts"],
    "schemaVersion": 2,
}


def _site_packages(python: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def _import(dataset: Path, out: Path, site: str) -> str:
    """`sglang-guard rules import` as a user runs it; its stderr."""
    proc = subprocess.run([sys.executable, "-m", "sglang_guard", "rules", "import",
                           str(dataset), "-o", str(out), "--sglang-src", site],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == EXIT_OK, proc.stderr
    return proc.stderr


def _only_pack(toml: Path, pack: Path) -> None:
    with toml.open("a", encoding="utf-8") as fh:
        fh.write(f"[rules]\ndefault_pack = false\npacks = [{json.dumps(str(pack))}]\n")


def test_seed_pack_alone_stays_quiet_on_the_line_cpu_prints(
        sglang_python: str, tmp_path: Path) -> None:
    """The seed's rule loads, matches nothing SGLang prints on CPU, changes nothing."""
    pack = tmp_path / "seed.toml"
    said = _import(SEED, pack, _site_packages(sglang_python))
    assert "1 rules (1 with an action, 0 advice)" in said, said
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port, CUTEDSL)
    toml = write_guard_toml(tmp_path / "guard.toml", max_failures=2, backoff_initial_s=0.1,
                            backoff_max_s=0.5)
    _only_pack(toml, pack)
    cmd = guard_run_cmd(sglang_python, state, given,
                        options=["--no-preflight", "--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        code = guard.wait_exit(240)
        assert code == EXIT_GIVE_UP, f"guard exited {code}; {guard.describe()}"
        guard.assert_tree_gone()
        log = guard.log_path.read_text(encoding="utf-8", errors="replace")
        assert CPU_MSG in log, "SGLang did not print the SM100 check's line"
        assert "cutedsl_mla backend can only be used with MLA models" not in log
        assert guard.events("remediated") == [], guard.describe()
        assert guard.events("advice") == [], guard.describe()
        starts = guard.events("child.start")
        assert [s.get("argv") for s in starts] == [given, given], starts


def test_imported_dataset_as_the_only_pack_fixes_and_serves(
        sglang_python: str, tmp_path: Path) -> None:
    """Seed + the CPU's record, imported against the installed 0.5.23 source: fixed, served."""
    dataset = tmp_path / "errors.jsonl"
    seed = json.loads(SEED.read_text(encoding="utf-8"))
    dataset.write_text(json.dumps(seed) + "\n" + json.dumps({"record": CPU_RECORD}) + "\n",
                       encoding="utf-8")
    pack = tmp_path / "imported.toml"
    said = _import(dataset, pack, _site_packages(sglang_python))
    assert "2 rules (2 with an action, 0 advice) from 2 records, 0 skipped" in said, said
    assert 'sglang_versions = "==0.5.23"' in pack.read_text(encoding="utf-8")

    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port, CUTEDSL)
    toml = write_guard_toml(tmp_path / "guard.toml")
    _only_pack(toml, pack)
    cmd = guard_run_cmd(sglang_python, state, given,
                        options=["--no-preflight", "--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        guard.wait_event("ready", READY_S)
        fixes = guard.events("remediated")
        assert len(fixes) == 1, f"expected one remediation, got {fixes}"
        fix = fixes[0]
        assert fix.get("trigger") == "log", fix
        assert fix.get("rule") == "cutedsl-mla-backend-requires-sm100", fix
        assert fix.get("rule") != SEED_RULE
        assert (fix.get("flag"), fix.get("action")) == ("--attention-backend", "drop_flag"), fix
        assert CPU_MSG in str(fix.get("line")), fix
        starts = guard.events("child.start")
        assert len(starts) == 2, starts
        assert starts[1].get("argv") == [a for a in given if a not in CUTEDSL]
        assert post_generate(port).get("output_ids"), guard.describe()
        assert guard.terminate() == EXIT_OK, guard.describe()
        guard.assert_tree_gone()
