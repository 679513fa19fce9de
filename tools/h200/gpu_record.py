"""Turn what the H200 runs sent back into the committed record (developer side).

    python tools/h200/gpu_record.py CASES.jsonl OUT.jsonl LOGS.tar.xz RUN_DIR... \
        [--superseded FIRST.jsonl]

Each RUN_DIR is one run's files as the device tool fetched them (raw-N.jsonl, logs-N.tar.xz,
checks.jsonl), oldest first. A line run twice (a phase-1 line cut by the wall clock, one that
needed FA3, or a guarded run made again by a later session) keeps its last outcome; with
`--superseded`, the earlier outcome of each guarded run that a later run replaced goes there
(its log under `superseded/` in LOGS), so what the guard did before its fixes stays on record.
A row whose case carries `rerun` was made by the second session's runs (`session` 2).
One compact JSON object a line: the case, plain SGLang's outcome (or the guarded run's),
the fatal line picked from the log, the device's `check --json` verdict, and for guarded runs
what the guard did (launches, fixes, exit, seconds to ready).
`cause` names why a line died, read off SGLang's own fatal line (`CAUSES`, first match wins);
`owned` says whether the guard can know it before launch (the replay tier's yardstick), and
`not_judged` marks the deaths for want of a package this run did not carry.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

# (cause, owned, pattern on the fatal line or the log). Owned: the guard can know it from the
# command line, the model, the GPU and the release alone. Not carried: a package SGLang needs
# for that line that this run left out (the README's list); such rows are not judged.
CAUSES: tuple[tuple[str, bool | None, str], ...] = (
    ("not-carried", None, r"No module named 'deep_gemm'|FlashAttention-4 CUTE is not available"
                          r"|requires the `hpc` package"),
    ("sm", True, r"only supported on Blackwell|requires an SM100|requires Blackwell"
                 r"|only supported on compute capability 10"),
    ("platform", True, r"No module named 'torch_npu'|No module named 'wave_lang'"
                       r"|decode_attention_cpu|cannot import name 'flash_mla_decode'"
                       r"|name '(?:mha_batch_prefill_func|flash_attn_varlen_func)' is not defined"),
    ("value", True, r"is deprecated\. Use --kv-cache-dtype"),
    ("context", True, r"context_length \(\d+\) is greater than the derived context_length"),
    ("arch", True, r"object has no attribute 'kv_lora_rank'|DSV4 MQA head_dim"
                   r"|Expect query and key/value to have the same embedding dimension"
                   r"|Expected size for first two dimensions of batch2 tensor"
                   r"|can only be used with non-MLA models"
                   r"|assert dual_chunk_attention_config is not None"),
    ("sglang-message", True, r"is only supported on decode for MLA models"
                             r"|KV4 MLA expects attention_backend"
                             r"|Flashinfer MLA only supports topk=1 for speculative decoding"
                             r"|speculative_eagle_topk > 1 with page_size > 1 is only supported"),
    ("memory", False, r"Loaded weights leave no GPU memory|OutOfMemoryError|Not enough memory"),
    ("kernel-dtype", False, r"Expected out tensor to have dtype|expected mat1 and mat2 to have "
                            r"the same dtype"),
)
_SKIP = re.compile(r"Pyspy|py-spy|^\s*File \"|^\s*raise |^\s*\^")
_FATAL = re.compile(r"(?:Error|Exception)\b.*?:|^[A-Za-z_.]*Error\s*$|sglang-guard: error:")


def fatal_line(text: str) -> str:
    """The last error line of a log (SGLang's crash path prints py-spy noise after it)."""
    lines = [x.rstrip() for x in text.splitlines() if x.strip() and not _SKIP.search(x)]
    hits = [x for x in lines if _FATAL.search(x) and not x.startswith("{")]
    line = hits[-1] if hits else ""
    return re.sub(r"^\[[0-9: -]+\]\s*", "", line)[:400]


def classify(fatal: str, log: str) -> tuple[str | None, bool | None]:
    for cause, owned, pat in CAUSES:
        if re.search(pat, fatal, re.M):
            return cause, owned
    for cause, owned, pat in CAUSES:  # the fatal line may be a wrapper: read the whole log
        if re.search(pat, log):
            return cause, owned
    return ("assert", False) if fatal.startswith("AssertionError") else ("other", False)


def guard_summary(log: str) -> dict[str, Any]:
    events = []
    for x in log.splitlines():
        if x.startswith("{") and '"event"' in x:
            try:
                events.append(json.loads(x))
            except ValueError:
                continue
    starts = [e for e in events if e.get("event") == "child.start" and "argv" in e]
    fixes = [{"rule": e.get("rule"), "flag": e.get("flag"), "action": e.get("action"),
              "old": e.get("old_value"), "new": e.get("new_value"), "line": e.get("line")}
             for e in events if e.get("trigger") == "log" and e.get("flag")]
    pre = [{"flag": e.get("flag"), "value": e.get("value"), "action": e.get("action")}
           for e in events if e.get("event") == "preflight.finding"]
    crashes = [e.get("rule") for e in events if e.get("event") == "crash.detected"]
    ready = [e for e in events if e.get("event") == "ready"]
    exits = [e for e in events if e.get("event") == "guard.exit"]
    refused = re.search(r"sglang-guard: error: (policy refused .*)", log)
    return {"launches": len(starts), "preflight": pre, "log_fixes": fixes,
            "restarts_same_argv": len(crashes), "ready_gen": ready[0].get("gen") if ready else None,
            "exit": exits[-1].get("code") if exits else (78 if refused else None),
            "reason": (exits[-1].get("reason") if exits else
                       (refused.group(1)[:300] if refused else None)),
            "argv_ready": _strip_local(ready[0]["argv"]) if ready else None}


def _strip_local(argv: list[str]) -> list[str]:
    """A device's argv without its port and with the model path relative to configs/models."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("--host", "--port"):
            skip = True
            continue
        model = i and argv[i - 1] == "--model-path"
        out.append("configs/models/" + a.rstrip("/").rsplit("/", 1)[-1] if model else a)
    return out


def check_summary(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    try:
        d = json.loads(rec["stdout"])
    except ValueError:
        return {"exit": rec["exit"], "error": rec["stderr"][-300:]}
    return {"exit": rec["exit"], "verdict": d["verdict"], "gpu": d["gpu"],
            "argv_out": _strip_local(d["argv_out"]),
            "findings": [{k: f.get(k) for k in ("flag", "value", "action", "new_value", "kind")}
                         for f in d.get("findings", [])]}


def _row(case: dict[str, Any], r: dict[str, Any], log: str, checks: dict[str, dict[str, Any]],
         log_name: str) -> dict[str, Any]:
    fatal = fatal_line(log) if r["outcome"] != "ready" else ""
    row: dict[str, Any] = {
        "id": case["id"], "model": case["model"], "mode": case["mode"], "args": case["args"],
        "drop_base": case["drop_base"], "phase": r["phase"], "outcome": r["outcome"],
        "seconds": r["seconds"], "output_ids": r.get("generate") if r["outcome"] ==
        "ready" else None, "fatal": fatal or None, "log": log_name}
    if r["outcome"] == "died":
        src = log if case["mode"] == "plain" else "\n".join(
            x for x in log.splitlines() if not x.startswith("{"))
        cause, owned = classify(fatal_line(src) or fatal, src)
        row["cause"], row["owned"] = cause, owned
        row["not_judged"] = cause == "not-carried"
    if case["mode"] != "plain":
        row["guard"] = guard_summary(log)
    else:
        row["check"] = check_summary(checks.get(case["id"]))
    if "rerun" in case:
        row["session"] = 2
    return row


def _add_log(tf: tarfile.TarFile, name: str, log: str) -> None:
    data = log.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("out")
    ap.add_argument("logs")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--superseded", default="")
    a = ap.parse_args()
    cases_p, out_p, logs_p, runs = a.cases, a.out, a.logs, a.runs
    cases = {c["id"]: c for c in map(json.loads, Path(cases_p).read_text().splitlines())}
    raw: dict[str, tuple[dict[str, Any], str]] = {}
    superseded: dict[str, tuple[dict[str, Any], str]] = {}
    checks: dict[str, dict[str, Any]] = {}
    for run in map(Path, runs):
        for f in sorted(run.glob("checks.jsonl")):
            for x in f.read_text().splitlines():
                r = json.loads(x)
                checks[r["id"]] = r
        logs: dict[str, str] = {}
        for t in run.glob("logs-*.tar.xz"):
            with tarfile.open(t) as tf:
                for m in tf.getmembers():
                    if m.isfile():
                        fh = tf.extractfile(m)
                        if fh is not None:
                            logs[Path(m.name).name] = fh.read().decode("utf-8", "replace")
        for f in sorted(run.glob("raw-*.jsonl")):
            for x in f.read_text().splitlines():
                r = json.loads(x)
                if r["outcome"] == "not-run":
                    continue
                before = raw.get(r["id"])
                if before is not None and "rerun" in cases.get(r["id"], {}) and \
                        before[0]["outcome"] in ("ready", "died"):
                    superseded[r["id"]] = before  # the last outcome before this run's
                raw[r["id"]] = (r, logs.get(r.get("log", ""), ""))
    rows, first = [], []
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w:xz") as tf:
        for cid, case in cases.items():
            if cid not in raw:
                continue
            r, log = raw[cid]
            rows.append(_row(case, r, log, checks, r["log"]))
            _add_log(tf, r["log"], log)
            if a.superseded and cid in superseded and case["mode"] != "plain":
                r0, log0 = superseded[cid]
                row0 = _row({k: v for k, v in case.items() if k != "rerun"}, r0, log0, checks,
                            "superseded/" + r0["log"])
                first.append(row0)
                _add_log(tf, row0["log"], log0)
    Path(logs_p).write_bytes(tar_buf.getvalue())
    for path, out_rows in ((out_p, rows), (a.superseded, first)):
        if path:
            with Path(path).open("w", encoding="utf-8") as out:
                for row in out_rows:
                    out.write(json.dumps(row, separators=(",", ":")) + "\n")
    print(f"{len(rows)} rows -> {out_p}; {len(first)} superseded; "
          f"logs {len(tar_buf.getvalue())} bytes -> {logs_p}")


if __name__ == "__main__":
    main()
