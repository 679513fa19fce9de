"""The guard against real SGLang 0.5.17 launches on an H200, replayed on CPU.

tests/data/h200-gpu-0.5.17.jsonl holds, for each command line, what real SGLang 0.5.17 did on
an NVIDIA H200 (SM 9.0): ready with /generate output, or died with its fatal line and the
seconds it took; and for guarded lines what `sglang-guard run` did there (tools/h200/ made it:
gpu_cases.py, serve_matrix.py, gpu_record.py; tests/data/h200-gpu-0.5.17.meta.json says with
what). Here, on CPU, preflight runs on each line with --gpu-sm 90 and release 0.5.17:

- no line that served is changed (a false drop is the worst bug);
- the deaths of an owned cause (arch, SM, platform, value, context, a message SGLang raises:
  `cause`/`owned` as gpu_record.CAUSES reads SGLang's own fatal line) are changed or refused
  before launch: the score is printed; the 90% bar is its own test;
- every guarded run's log fix is what `explain` names on its recorded log today;
- every guarded run (all of them made again on the H200 by the second session, with the guard
  as it then was: `session` 2) reached ready with a fix or ended with a non-restartable status
  and SGLang's reason, never relaunching the same command line more than once.
Rows that died for want of a package the run did not carry (`not_judged`) are counted, never
judged. What the first session's guard did on the same lines (three crash loops among them)
is kept in h200-gpu-0.5.17-superseded.jsonl and replayed by
tests/integration/test_h200_crash_loops.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.config.guardconfig import PolicyConfig
from sglang_guard.preflight.preflight import Decision
from sglang_guard.preflight.shell.inputs import decide, gather
from sglang_guard.preflight.shell.whichrelease import Release, resolve_release

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
RECORD = DATA / "h200-gpu-0.5.17.jsonl"
LOGS = DATA / "h200-gpu-0.5.17-logs.tar.xz"
META = json.loads((DATA / "h200-gpu-0.5.17.meta.json").read_text(encoding="utf-8"))
MODELS = ROOT / "configs" / "models"
# The base flags every line ran with (tools/h200/serve_matrix.py BASE), less the ones a line
# overrides (its `drop_base`).
BASE = {
    "load-format": ["--load-format", "dummy"],
    "tokenizer": ["--skip-tokenizer-init"],
    "mem-fraction-static": ["--mem-fraction-static", "0.15"],
    "max-total-tokens": ["--max-total-tokens", "8192"],
    "cuda-graph": ["--cuda-graph-backend-decode", "disabled",
                   "--cuda-graph-backend-prefill", "disabled"],
}
BAR = 0.90


def _rows() -> list[dict[str, Any]]:
    return [json.loads(x) for x in RECORD.read_text(encoding="utf-8").splitlines() if x.strip()]


ROWS = _rows()
PLAIN = [r for r in ROWS if r["mode"] == "plain"]
GUARDED = [r for r in ROWS if r["mode"] != "plain"]


def _argv(row: dict[str, Any]) -> list[str]:
    out = ["--model-path", str(MODELS / row["model"]), *row["args"]]
    for key, flags in BASE.items():
        if key not in row["drop_base"]:
            out += flags
    return out


@pytest.fixture(scope="module")
def facts_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("h200-gpu-facts")


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch: pytest.MonkeyPatch, facts_cache: Path) -> Iterator[None]:
    monkeypatch.setenv("SGLANG_GUARD_CACHE", str(facts_cache))
    yield


@cache
def _release() -> Release:
    return resolve_release(version="0.5.17", version_source="the H200 GPU record", python=None)


def _decide(row: dict[str, Any]) -> Decision:
    return decide(gather(_argv(row), "90", _release()), PolicyConfig(),
                  str(ROOT / "no-state"))


@cache
def _log(name: str) -> str:
    with tarfile.open(LOGS) as tf:
        fh = tf.extractfile(name)
        assert fh is not None
        return fh.read().decode("utf-8", "replace")


def test_record_shape() -> None:
    """The acceptance counts: at least 60 plain lines and 8 guarded runs, on an H200."""
    assert META["gpu"]["name"] == "NVIDIA H200" and META["software"]["sglang"] == "0.5.17"
    assert len(PLAIN) >= 60 and len(GUARDED) >= 8
    # every guarded run is the second session's, made with the guard of its commit
    assert all(r.get("session") == 2 for r in GUARDED)
    assert {run["session"] for run in META["runs"]} == {1, 2} and META["guard_commit"]
    served = [r for r in PLAIN if r["outcome"] == "ready"]
    assert served and all(r["output_ids"] for r in served)
    assert all(r["outcome"] in ("ready", "died") for r in ROWS)
    # the device's own check read the GPU through NVML on every plain line
    gpus = {json.dumps(r["check"]["gpu"], sort_keys=True) for r in PLAIN if r.get("check")}
    assert gpus == {json.dumps({"name": "NVIDIA H200", "sm": 90, "source": "nvml"},
                               sort_keys=True)}
    with tarfile.open(LOGS) as tf:
        names = set(tf.getnames())
    assert {r["log"] for r in ROWS} <= names
    assert LOGS.stat().st_size + RECORD.stat().st_size < 5 * 2**20


@pytest.mark.parametrize("row", [r for r in PLAIN if r["outcome"] == "ready"],
                         ids=lambda r: r["id"])
def test_no_line_that_served_is_changed(row: dict[str, Any]) -> None:
    d = _decide(row)
    assert d.verdict == "ok", [f"{f.flag} {f.value}: {f.action} ({f.reason})"
                               for f in d.findings]


def _owned_deaths() -> list[dict[str, Any]]:
    return [r for r in PLAIN if r["outcome"] == "died" and r.get("owned")]


def _score() -> tuple[int, int, list[str]]:
    owned = _owned_deaths()
    missed = [r["id"] for r in owned if _decide(r).verdict == "ok"]
    return len(owned) - len(missed), len(owned), missed


def test_owned_deaths_score_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """Every owned death counted and its verdict read; the score goes to the test output."""
    caught, total, missed = _score()
    not_judged = [r["id"] for r in PLAIN if r.get("not_judged")]
    with capsys.disabled():
        print(f"\nH200 0.5.17 record: {caught}/{total} owned deaths caught before launch "
              f"({100 * caught / max(total, 1):.0f}%); {len(not_judged)} not judged "
              f"(package not carried); missed: {', '.join(missed)}")
    assert total >= 30  # the record is what it says: most deaths are owned ones
    # a death the device's own check caught is caught here too (same guard, --gpu-sm 90)
    device_caught = {r["id"] for r in _owned_deaths()
                     if r["check"] and r["check"]["verdict"] != "ok"}
    assert not device_caught & set(missed)


def test_owned_deaths_caught_before_launch(capsys: pytest.CaptureFixture[str]) -> None:
    caught, total, missed = _score()
    with capsys.disabled():
        print(f"\nH200 0.5.17 record: {caught}/{total} owned deaths caught before launch "
              f"({100 * caught / total:.1f}%, bar {100 * BAR:.0f}%)")
    assert caught / total >= BAR, missed


def _sglang_lines_before_fix(log: str) -> str:
    """SGLang's own output of the launch that the guard fixed (its JSON events left out)."""
    out = []
    for x in log.splitlines():
        if x.startswith("{"):
            try:
                ev = json.loads(x)
            except ValueError:
                ev = {}
            if ev.get("trigger") == "log":
                break
            continue
        out.append(x)
    return "\n".join(out) + "\n"


def _first_argv(log: str) -> list[str]:
    for x in log.splitlines():
        if x.startswith("{") and '"child.start"' in x:
            ev = json.loads(x)
            if "argv" in ev:
                argv = list(ev["argv"])
                i = argv.index("--model-path") + 1
                argv[i] = str(MODELS / Path(argv[i]).name)
                return argv
    raise AssertionError("no launch in the log")


FIXED = [r for r in GUARDED if r["guard"]["log_fixes"]]


@pytest.mark.parametrize("row", FIXED, ids=lambda r: r["id"])
def test_guarded_log_fix_reproduced_by_explain(row: dict[str, Any], tmp_path: Path) -> None:
    log = _log(row["log"])
    path = tmp_path / "sglang.log"
    path.write_text(_sglang_lines_before_fix(log), encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "sglang_guard", "explain", "--json",
                        "--gpu-sm", "90", str(path), "--", *_first_argv(log)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    fix = json.loads(p.stdout)["fix"]
    want = row["guard"]["log_fixes"][0]
    assert fix is not None
    # The same change on the same flag; the rule's name may have moved since the record
    # was made (the record keeps the name that fired on the GPU).
    assert (fix["flag"], fix["action"], fix["new_value"]) == (
        want["flag"], want["action"], want["new"])


def _launch_argvs(log: str) -> list[tuple[str, ...]]:
    """The command line of each launch the guard made, as its JSON records name them."""
    out = []
    for x in log.splitlines():
        if x.startswith("{") and '"child.start"' in x:
            ev = json.loads(x)
            if "argv" in ev:
                out.append(tuple(ev["argv"]))
    return out


def _exception_line(log: str) -> str:
    """SGLang's own last exception line in a guarded log (its JSON records left out)."""
    lines = [x for x in log.splitlines() if x and not x.startswith(("{", " ", "["))
             and ("Error: " in x or "Exception: " in x)]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("row", GUARDED, ids=lambda r: r["id"])
def test_guarded_run_ends_ready_or_with_a_reason_never_in_a_loop(row: dict[str, Any]) -> None:
    """Ready with a fix (or unchanged), or a non-restartable exit with SGLang's reason; no
    command line launched more than twice (one relaunch, then give_up_on_repeat)."""
    g = row["guard"]
    argvs = _launch_argvs(_log(row["log"]))
    assert len(argvs) == g["launches"]
    assert all(argvs.count(a) <= 2 for a in argvs), row["id"]
    if row["outcome"] == "ready":
        assert g["ready_gen"] == g["launches"] and g["exit"] == 0, row["id"]
        # more than one launch only where a fix changed the line
        assert g["launches"] == 1 or len(set(argvs)) == g["launches"], row["id"]
    elif g["exit"] == 78:  # refused before launch: the preflight finding says why
        assert g["launches"] == 0 and g["preflight"] and g["reason"], row["id"]
    else:  # gave up: the same crash twice, SGLang's own exception line as the reason
        assert g["exit"] == 75 and g["launches"] == 2 and len(set(argvs)) == 1, row["id"]
        line = _exception_line(_log(row["log"]))
        assert line and line in g["reason"], (line, g["reason"])


def test_memory_and_seed_fixes_reached_ready(capsys: pytest.CaptureFixture[str]) -> None:
    """The seed case and the memory failures: fixed by the guard on the GPU, with figures."""
    by_id = {r["id"]: r for r in ROWS}
    pairs = [("llama-hd128|attention-backend=cutedsl_mla", "|guard"),
             ("llama-hd128|attention-backend=cutedsl_mla", "|guard-nopf"),
             ("dsv3-mla576|attention-backend=triton,mem-fraction-static=0.001", "|guard"),
             ("llama-hd128|cuda-graph-max-bs=4096,mem-fraction-static=0.985", "|guard"),
             ("dsv3-mla576|attention-backend=cutlass_mla", "|guard"),
             ("dsv3-mla576|attention-backend=cutlass_mla", "|guard-nopf"),
             ("dsv3-mla576|attention-backend=flashinfer,speculative-eagle-topk=2", "|guard")]
    lines = []
    for plain_id, mode in pairs:
        plain, guarded = by_id[plain_id], by_id[plain_id + mode]
        assert plain["outcome"] == "died" and guarded["outcome"] == "ready", plain_id
        g = guarded["guard"]
        assert g["preflight"] or g["log_fixes"], plain_id
        lines.append(f"{plain_id}{mode}: plain died after {plain['seconds']} s; guarded ready "
                     f"after {guarded['seconds']} s in {g['launches']} launch(es)")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


SUPERSEDED = [json.loads(x) for x in (DATA / "h200-gpu-0.5.17-superseded.jsonl").read_text(
    encoding="utf-8").splitlines() if x.strip()]


def test_superseded_runs_were_made_again() -> None:
    """Each guarded run of the first session is in the record again, made by the second;
    the three that relaunched the same line four times (made before the repeat check, issue
    19 item 6; replayed live by tests/integration/test_h200_crash_loops.py) now reach ready
    (preflight drops the backend) and, without preflight, end after two launches."""
    by_id = {r["id"]: r for r in ROWS}
    assert len(SUPERSEDED) >= 12 and all(r["id"] in by_id for r in SUPERSEDED)
    loops = [r for r in SUPERSEDED if r["guard"]["launches"] > 2]
    assert len(loops) == 3
    for r in loops:
        now = by_id[r["id"]]
        assert now["outcome"] == "ready" and now["guard"]["preflight"], r["id"]
        nopf = by_id[r["id"].replace("|guard", "|guard-nopf")]
        assert nopf["guard"]["launches"] == 2 and nopf["guard"]["exit"] == 75, r["id"]


# SGLang 0.5.17 reads these off a DeepSeek-V3 config (sglang/srt/models/deepseek_v2.py), and
# transformers 5.12.1 (its pin) has no default for them: without them the server dies at init.
DSV3_FIELDS_5_12 = ("moe_layer_freq", "topk_method", "scoring_func")


@pytest.mark.parametrize("name", ["tiny-deepseek-v3", "dsv3-mla576"])
def test_deepseek_configs_carry_what_older_transformers_need(name: str) -> None:
    cfg = json.loads((MODELS / name / "config.json").read_text(encoding="utf-8"))
    assert cfg["model_type"] == "deepseek_v3"
    assert all(k in cfg for k in DSV3_FIELDS_5_12), name
    # both spellings of the rope settings: rope_parameters (5.19+), rope_scaling (5.12)
    assert "rope_parameters" in cfg


def test_gpu_models_have_real_attention_shapes() -> None:
    """The shapes that serve on SM90 (the tiny ones fit no kernel there)."""
    mha = json.loads((MODELS / "llama-hd128" / "config.json").read_text(encoding="utf-8"))
    mla = json.loads((MODELS / "dsv3-mla576" / "config.json").read_text(encoding="utf-8"))
    assert mha["head_dim"] == 128
    assert (mla["kv_lora_rank"], mla["qk_rope_head_dim"], mla["qk_nope_head_dim"],
            mla["v_head_dim"]) == (512, 64, 128, 128)
    assert "rope_scaling" in mla  # transformers 5.12 reads the yarn settings from here
