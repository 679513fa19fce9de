"""What the guard does with the corpus of real failures (tests/data/realworld): issue 12, item 7.

    python bench/corpus.py [--json PATH]

For every entry with a command line, `sglang-guard check` runs on it (the entry's GPU SM, or
none; its SGLang release where the thread names one) -- a change preflight makes means zero
failed launches. Then `explain LOG -- ARGS` over the excerpt, as the supervisor would decide
after the first failure -- one failed launch. Each entry lands in one row:

- prevented by preflight: `check` changes or refuses the command line before any launch, and
  (for a flag entry) the change is the one the thread confirms;
- fixed on the log path: the first failure's output names the confirmed fix;
- refused/given up with a reason: the log path stops with SGLang's reason (an environment
  failure, exit 69; a give-up rule, exit 75; SGLang's parser rejecting the command line,
  exit 2), no flag change; or preflight refuses a `flag` entry's command line without
  making the change the thread confirms;
- restart only, or nothing: the rest (hangs are the stage watch's, not the log's);
- preflight changed something else: a change the thread does not confirm (for a `none`
  entry that would be a false fix; for `unconfirmed` ones the thread cannot say).
Counts only; the per-entry verdicts are the corpus test's (tests/unit/test_realworld_corpus).
The held-apart entries (tests/data/realworld-held) get their own table, and both sets their
confirmed-only score (the `confirmed` flag entries whose fix the log path proposes) and the
count of flag changes no thread confirms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "unit"))

from test_realworld_corpus import (  # noqa: E402
    ENTRIES,
    HELD,
    _of_kind,
    _version,
    propose,
    score,
    unconfirmed_changes,
    verdict,
)

from sglang_guard.common.outcomes import FixKind  # noqa: E402

ROWS = ("prevented by preflight (0 failed launches)", "fixed on the log path (1 failed launch)",
        "refused or given up with a reason", "restart only", "nothing proposed",
        "preflight changed something else")


MODEL_FLAGS = ("--model-path", "--model")


def _argv(entry: dict[str, Any]) -> list[str]:
    """The entry's flags, with a model path `check` can read: the thread's hub id, else a
    placeholder (offline, either is "unknown" to the arch checks; a local path from the
    thread's machine does not exist here)."""
    hub = entry.get("model", "")
    model = hub if hub.count("/") == 1 and not hub.startswith((".", "/")) else "unknown/model"
    out, skip = [], False
    for arg in entry["argv"]:
        if skip:
            skip = False
            continue
        if arg in MODEL_FLAGS:
            skip = True
            continue
        if arg.startswith(tuple(f + "=" for f in MODEL_FLAGS)):
            continue
        out.append(arg)
    return ["--model-path", model, *out]


def check(entry: dict[str, Any]) -> dict[str, Any] | None:
    """`sglang-guard check --json` on the entry's command line; None without one, or where
    the thread's release is older than the oldest shipped table (0.5.1)."""
    if not entry["argv"]:
        return None
    cmd = [sys.executable, "-m", "sglang_guard", "check", "--json",
           "--gpu-sm", str(entry["sm"]) if entry.get("sm") else "none"]
    if version := _version(entry.get("sglang", "")):
        cmd += ["--sglang-version", version]
    run = subprocess.run([*cmd, "--", *_argv(entry)], capture_output=True, text=True,
                         check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    # 2: SGLang's own parser rejects the command line (`verdict` "rejected"), a refusal too.
    if run.returncode not in (0, 1, 2, 78) or not run.stdout.strip():
        return {"error": run.stderr.strip()[-300:], "code": run.returncode}
    doc: dict[str, Any] = json.loads(run.stdout)
    doc["code"] = run.returncode
    return doc


def _matches(want: dict[str, Any], finding: dict[str, Any]) -> bool:
    """Whether a preflight finding is the change the thread confirms."""
    if finding["flag"] != want["flag"]:
        return False
    if want["change"] == "drop":
        return bool(finding["action"] == "drop")
    if want["change"] == "set":
        return bool(finding["new_value"] == (want["value"] or None))
    return False  # raise/lower: a memory size, which preflight never guesses


def row(entry: dict[str, Any], doc: dict[str, Any] | None) -> str:
    findings = [f for f in (doc or {}).get("findings", []) if f.get("action") != "warn"]
    want = entry["fix"]
    # Refused (78) or rejected by SGLang's parser (2): no launch. An error dict (a release
    # older than the oldest table, say) has no verdict and falls through to the log path.
    if doc is not None and doc.get("verdict") in ("refused", "rejected"):
        return ROWS[0] if want["kind"] != "flag" else ROWS[2]
    if findings:
        if want["kind"] == "flag" and any(_matches(want, f) for f in findings):
            return ROWS[0]
        return ROWS[5]
    fix = propose(entry)
    if fix is not None and want["kind"] == "flag" and verdict(entry, fix) is None:
        return ROWS[1]
    if fix is not None and fix.action in (FixKind.GIVE_UP, FixKind.ENVIRONMENT, FixKind.PARSER_EXIT):
        return ROWS[2]
    if fix is not None and fix.action == FixKind.RESTART:
        return ROWS[3]
    return ROWS[4]


def table(entries: list[dict[str, Any]], title: str) -> dict[str, dict[str, int]]:
    """Print one table of rows by kind; return the counts."""
    by_kind: dict[str, Counter[str]] = {}
    for entry in entries:
        kind = entry["fix"]["kind"]
        by_kind.setdefault(kind, Counter())[row(entry, check(entry))] += 1
    total = Counter[str]()
    for counts in by_kind.values():
        total.update(counts)
    print(f"# {len(entries)} {title}, by the fix their thread confirms "
          "(flag / none / unconfirmed / hang)")
    kinds = ("flag", "none", "unconfirmed", "hang")
    print(f"{'':44s}" + "".join(f"{k:>13s}" for k in (*kinds, "all")))
    for name in ROWS:
        print(f"{name:44s}" + "".join(f"{by_kind.get(k, Counter())[name]:13d}" for k in kinds)
              + f"{total[name]:13d}")
    return {k: dict(v) for k, v in by_kind.items()}


def scores(entries: list[dict[str, Any]], title: str) -> dict[str, int]:
    """The confirmed-only score and the flag changes no thread confirms, printed."""
    fixed, fixable, _ = score(_of_kind(entries, "flag"))
    changes = unconfirmed_changes(entries)
    print(f"{title}: {fixed}/{fixable} confirmed flag fixes proposed on the log path; "
          f"{len(changes)} flag changes no thread confirms")
    return {"fixed": fixed, "fixable": fixable, "unconfirmed_changes": len(changes)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the counts as JSON here")
    args = ap.parse_args()
    out = {"corpus": table(ENTRIES, "corpus entries")}
    print()
    out["held"] = table(HELD, "held-apart entries (tests/data/realworld-held)")
    print()
    out["scores"] = {"corpus": scores(ENTRIES, "corpus"), "held": scores(HELD, "held apart")}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
