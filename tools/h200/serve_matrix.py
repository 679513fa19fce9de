"""Launch SGLang command lines side by side on one GPU; one raw JSON record a line (device side).

    python3 serve_matrix.py CASES.jsonl MODELS_DIR OUT_DIR --phase 1 --slots 12 --wall 480

Plain lines run `python3 -m sglang.launch_server`; guarded ones `python3 -m sglang_guard run`.
A line is ready when /health answers 200 and one /generate of token ids returns output_ids;
it died when its process exited first. Every server is stopped (its whole process tree) as
soon as its outcome is known. Only the standard library and psutil (on the image): this runs
under the H200 image's python3, next to the carried SGLang site dir.

Raw records only (times, exit status, the log file): tools/h200/gpu_record.py turns them into
the committed record on the developer's machine.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil

BASE = {
    "load-format": ["--load-format", "dummy"],
    "tokenizer": ["--skip-tokenizer-init"],
    "mem-fraction-static": ["--mem-fraction-static", "0.15"],
    "max-total-tokens": ["--max-total-tokens", "8192"],
    "cuda-graph": ["--cuda-graph-backend-decode", "disabled",
                   "--cuda-graph-backend-prefill", "disabled"],
}
ENV_FIXED = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
             "NVSHMEM_DISABLE_NVLS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
             "TRANSFORMERS_VERBOSITY": "error"}
_port_lock = threading.Lock()
_next_port = [20000]


def pick_port() -> int:
    """A port that is free now, with the next 40 left to SGLang's own derived ports."""
    with _port_lock:
        while True:
            p = _next_port[0]
            _next_port[0] += 41
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    continue
            return p


def full_argv(case: dict[str, Any], models: str) -> list[str]:
    """The case's SGLang arguments, its model path and the base flags it keeps."""
    out = ["--model-path", f"{models}/{case['model']}", *case["args"]]
    for key, flags in BASE.items():
        if key not in case["drop_base"]:
            out += flags
    return out


def http_json(port: int, method: str, path: str, body: dict[str, Any] | None,
              timeout: float) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw or b"null")
        except ValueError:
            return resp.status, raw.decode("utf-8", "replace")[:200]
    finally:
        conn.close()


def stop_tree(proc: subprocess.Popen[bytes], graceful: bool) -> int | None:
    """Stop a process and every descendant (SGLang's scheduler and detokenizer too)."""
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    if graceful and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=40)
    if proc.poll() is None:
        kids.append(psutil.Process(proc.pid))
    for p in kids:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        return None


class Runner:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out = Path(a.out)
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + a.wall
        self.cv = threading.Condition()
        self.free = a.slots
        self.exclusive = False
        self.records: list[dict[str, Any]] = []
        self.rec_path = self.out / f"raw-{a.phase}.jsonl"

    def left(self) -> float:
        return float(self.deadline - time.monotonic())

    def acquire(self, n: int) -> bool:
        with self.cv:
            while self.free < n:
                if self.left() < self.a.min_left:
                    return False
                self.cv.wait(1.0)
            if self.left() < self.a.min_left:
                return False
            self.free -= n
            return True

    def release(self, n: int) -> None:
        with self.cv:
            self.free += n
            self.cv.notify_all()

    def write(self, rec: dict[str, Any]) -> None:
        with self.cv:
            self.records.append(rec)
            with self.rec_path.open("a") as f:
                f.write(json.dumps(rec) + "\n")

    def job(self, case: dict[str, Any]) -> None:
        n = self.a.slots if case["exclusive"] else 1
        if not self.acquire(n):
            self.write({"id": case["id"], "outcome": "not-run", "phase": self.a.phase})
            return
        try:
            self.launch(case)
        finally:
            self.release(n)

    def launch(self, case: dict[str, Any]) -> None:
        port = pick_port()
        argv = full_argv(case, self.a.models)
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        env = dict(os.environ, **ENV_FIXED, SGLANG_GUARD_STATUS_LISTEN="off")
        safe = case["id"].replace("|", "__").replace("=", "-").replace(",", "+")
        log = self.logs / f"{safe}.log"
        if case["mode"] == "plain":
            cmd = ["python3", "-m", "sglang.launch_server", *argv]
        else:
            state = Path(self.a.state) / safe
            state.mkdir(parents=True, exist_ok=True)
            cmd = ["python3", "-m", "sglang_guard", "run", "--gpu-sm", "auto",
                   "--python", "python3", "--log-format", "json", "--state-dir", str(state)]
            if case["mode"] == "guard-nopf":
                cmd.append("--no-preflight")
            cmd += ["--", *argv]
        start = time.monotonic()
        rec: dict[str, Any] = {"id": case["id"], "phase": self.a.phase, "port": port,
                               "cmd": cmd, "log": log.name,
                               "started_at": round(start - self.t0, 1)}
        with log.open("wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, stdin=subprocess.DEVNULL)
        outcome, detail, last_health = self.wait_ready(proc, port, start, rec)
        rec["seconds"] = round(time.monotonic() - start, 1)
        rec["outcome"] = outcome
        rec["generate"] = detail
        rec["last_health"] = last_health
        if proc.poll() is None:
            rc = stop_tree(proc, graceful=case["mode"] != "plain")
            rec["stop_exit"] = rc
            rec["stopped_after"] = round(time.monotonic() - start, 1)
        if case["mode"] != "plain":  # the guard's journal too, should its stdout miss a record
            for j in sorted((Path(self.a.state) / safe).rglob("*.jsonl")):
                with contextlib.suppress(OSError):
                    (self.logs / f"{safe}.{j.name}").write_bytes(j.read_bytes())
        self.write(rec)

    def wait_ready(self, proc: subprocess.Popen[bytes], port: int, start: float,
                   rec: dict[str, Any]) -> tuple[str, Any, int | None]:
        """Poll until the server answers /generate, its process exits, or time runs out."""
        limit = min(self.a.ready_timeout, self.left() - 15)
        outcome, detail = "timeout", None
        last_health = None
        while True:
            now = time.monotonic()
            rc = proc.poll()
            if rc is not None:
                rec["exit"] = rc
                return "died", detail, last_health
            if now - start > limit:
                outcome = "timeout" if now - start >= self.a.ready_timeout else "cut"
                return outcome, detail, last_health
            try:
                st, _ = http_json(port, "GET", "/health", None, 3)
                last_health = st
                if st == 200:
                    st2, body = http_json(port, "POST", "/generate", {
                        "input_ids": [1, 2, 3, 4, 5],
                        "sampling_params": {"max_new_tokens": 4, "temperature": 0}}, 120)
                    if st2 == 200 and isinstance(body, dict) and "output_ids" in body:
                        return "ready", body.get("output_ids"), last_health
                    detail = {"status": st2, "body": str(body)[:300]}
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(1.0)

    def run(self, cases: list[dict[str, Any]]) -> None:
        plain = [c for c in cases if not c["exclusive"]]
        excl = [c for c in cases if c["exclusive"]]
        threads = []
        for c in plain:
            t = threading.Thread(target=self.job, args=(c,), daemon=True)
            t.start()
            threads.append(t)
            time.sleep(self.a.stagger)
        for t in threads:
            t.join()
        for c in excl:  # one at a time, the GPU to itself
            self.job(c)


def run_checks(cases: list[dict[str, Any]], models: str, out: Path, workers: int) -> None:
    """`sglang-guard check --json` on each plain line, reading the real GPU through NVML."""
    from concurrent.futures import ThreadPoolExecutor

    env = dict(os.environ, **ENV_FIXED)

    def one(case: dict[str, Any]) -> dict[str, Any]:
        cmd = ["python3", "-m", "sglang_guard", "check", "--json", "--gpu-sm", "auto",
               "--python", "python3", "--state-dir", "/tmp/h23/check-state",  # noqa: S108 - device scratch
               "--",
               *full_argv(case, models), "--host", "127.0.0.1", "--port", "30999"]
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, env=env, timeout=120, check=False,
                               stdin=subprocess.DEVNULL)
            rc, so, se = p.returncode, p.stdout.decode(errors="replace"), \
                p.stderr.decode(errors="replace")
        except subprocess.TimeoutExpired:
            rc, so, se = None, "", "timeout"
        return {"id": case["id"], "exit": rc, "stdout": so, "stderr": se[-2000:],
                "seconds": round(time.monotonic() - t, 1)}

    with ThreadPoolExecutor(workers) as ex, (out / "checks.jsonl").open("w") as f:
        for r in ex.map(one, [c for c in cases if c["mode"] == "plain"]):
            f.write(json.dumps(r) + "\n")
            f.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("models")
    ap.add_argument("out")
    ap.add_argument("--phase", type=int, default=0)
    ap.add_argument("--slots", type=int, default=12)
    ap.add_argument("--wall", type=float, default=480)
    ap.add_argument("--min-left", type=float, default=45)
    ap.add_argument("--ready-timeout", type=float, default=330)
    ap.add_argument("--stagger", type=float, default=0.5)
    ap.add_argument("--state", default="/tmp/h23/state")  # noqa: S108 - device scratch
    ap.add_argument("--only", action="append", default=[],
                    help="a case id to run (repeatable; default: the phase's)")
    ap.add_argument("--also", default="", help="a raw-N.jsonl whose FA3-less deaths to rerun")
    ap.add_argument("--checks", type=int, default=0, help="run the guard checks, N workers")
    ap.add_argument("--rerun", type=int, default=0,
                    help="run the cases whose `rerun` is N (not the phase's)")
    a = ap.parse_args()
    cases = [json.loads(x) for x in Path(a.cases).read_text().splitlines() if x.strip()]
    if a.checks:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        run_checks(cases, a.models, Path(a.out), a.checks)
        return
    want = {c["id"] for c in cases if (c.get("rerun") == a.rerun if a.rerun else
                                       c["phase"] == a.phase)}
    if a.also and Path(a.also).exists():
        for x in Path(a.also).read_text().splitlines():
            r = json.loads(x)
            logp = Path(a.also).parent / "logs" / r.get("log", "-")
            text = logp.read_text(errors="replace") if logp.is_file() else ""
            if r["outcome"] in ("not-run", "cut") or "Can not import FA3" in text:
                want.add(r["id"])
    if a.only:
        want = set(a.only)
    todo = [c for c in cases if c["id"] in want]
    print(f"phase {a.phase}: {len(todo)} lines, {a.slots} slots, {a.wall:.0f}s", flush=True)
    Runner(a).run(todo)
    print("done", flush=True)


if __name__ == "__main__":
    main()
