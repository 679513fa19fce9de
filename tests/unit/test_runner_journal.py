"""Preflight findings in the journal: each fix once, even when a reload re-runs preflight."""

from __future__ import annotations

from pathlib import Path

from sglang_guard.preflight.preflight import Decision, Finding
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise.shell.journal import Journal, read_journal
from sglang_guard.supervise.shell.runner import journal_preflight


def _decision(value: str) -> Decision:
    finding = Finding(flag="--attention-backend", value=value, action="drop", new_value=None,
                      reason="needs MLA", kind="arch")
    argv = ("--model-path", "/m", "--attention-backend", value, "--api-key", "s3cret")
    return Decision("remediated", argv, argv[:2] + argv[4:], (finding,))


def test_the_same_fix_is_journaled_once_new_ones_are_added(tmp_path: Path) -> None:
    journal = Journal.open(str(tmp_path))
    seen: set[tuple[str, str | None, str, str | None]] = set()
    table = load_option_table()
    journal_preflight(journal, _decision("cutedsl_mla"), table, seen)
    journal_preflight(journal, _decision("cutedsl_mla"), table, seen)  # a reload: same fix
    journal_preflight(journal, _decision("trtllm_mla"), table, seen)  # a new one
    journal.close()
    records = list(read_journal(tmp_path / "journal.jsonl"))
    assert [(r["event"], r["trigger"], r["value"]) for r in records] == [
        ("remediated", "preflight", "cutedsl_mla"), ("remediated", "preflight", "trtllm_mla")]
    assert "s3cret" not in (tmp_path / "journal.jsonl").read_text()
