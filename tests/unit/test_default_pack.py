"""The shipped rule pack against SGLang 0.5.23's own messages, healthy lines and real logs."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglang_guard.resources import config_path
from sglang_guard.rules.fixes import Above, Literal
from sglang_guard.rules.logline import clean
from sglang_guard.rules.rules import (
    Fix,
    MatchContext,
    Matcher,
    Rule,
    first_fix,
    load_default_pack,
)
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import known_releases, load_option_table, load_release
from sglang_guard.supervise.replay import env_for, replay
from support.sglang import sglang_src

DATA = Path(__file__).resolve().parent.parent / "data"
MESSAGES: dict[str, Any] = tomllib.loads(
    (DATA / "sglang-messages-0.5.23.toml").read_text(encoding="utf-8")
)
# Messages of other releases (issue 12: a rule per release's wording, with its range).
OTHER: dict[str, Any] = tomllib.loads(
    (DATA / "sglang-messages-other-releases.toml").read_text(encoding="utf-8")
)
PACK = load_default_pack()
MATCHER = Matcher([PACK])
RULES = {r.id: r for r in PACK.rules}
LOGS = sorted((DATA / "sglang-logs").glob("*.log"))


def _options() -> dict[str, dict[str, Any]]:
    doc = json.loads(config_path("sglang", "options-0.5.23.json").read_text(encoding="utf-8"))
    return {o["strings"][0]: o for o in doc["options"]}


OPTIONS = _options()


def test_pack_is_for_0_5_23() -> None:
    assert PACK.name == "default"
    assert "0.5.23" in PACK.sglang_versions
    assert len(RULES) == len(PACK.rules)


@pytest.mark.parametrize("msg", MESSAGES["message"], ids=lambda m: f"{m['rule']}@{m['source']}")
def test_each_message_is_caught_by_its_rule(msg: dict[str, str]) -> None:
    matched = [r.id for r in MATCHER.candidates(clean(msg["text"].encode(), 4096))]
    assert msg["rule"] in matched, f"{msg['text']!r} matched {matched}"


@pytest.mark.parametrize("rule", PACK.rules, ids=lambda r: r.id)
def test_each_rule_has_a_message_and_a_source(rule: Rule) -> None:
    every = MESSAGES["message"] + OTHER["message"]
    caught = [m for m in every if rule in MATCHER.candidates(m["text"])]
    assert caught, f"no message in the data file exercises {rule.id}"
    assert rule.source and rule.reason


def test_every_listed_attention_backend_message_is_covered() -> None:
    listed = [m for m in MESSAGES["message"] if m["family"] == "attention-backend"]
    assert len(listed) >= 40  # the list itself must not shrink by accident
    uncovered = [
        m["source"] for m in listed if not any(r.fatal for r in MATCHER.candidates(m["text"]))
    ]
    assert uncovered == []


@pytest.mark.parametrize("line", MESSAGES["healthy"]["lines"])
def test_no_rule_matches_a_healthy_line(line: str) -> None:
    assert MATCHER.candidates(clean(line.encode(), 4096)) == ()


def test_reference_log_before_the_failure_is_healthy() -> None:
    ref = Path("/work/shared/reference/llama-cutedsl-cpu.log")
    if not ref.is_file():
        pytest.skip("reference log not on this machine")
    lines = ref.read_bytes().splitlines()
    hits = [
        (i, [r.id for r in MATCHER.candidates(clean(raw, 4096))]) for i, raw in enumerate(lines)
    ]
    hits = [h for h in hits if h[1]]
    assert hits == [(len(lines) - 1, ["cutedsl-mla-requires-sm100"])]


def _releases_of(rule: Rule) -> list[str]:
    """The shipped releases a rule may act on (its `when.sglang`, else every one)."""
    spec = SpecifierSet(rule.conditions.sglang or "")
    return [v for v in known_releases() if spec.contains(v, prereleases=True)]


@pytest.mark.parametrize("rule", PACK.rules, ids=lambda r: r.id)
def test_flags_and_values_exist_in_a_release_the_rule_covers(rule: Rule) -> None:
    """Each flag a rule names exists (exactly) in a release the rule covers, with its values."""
    releases = _releases_of(rule)
    assert releases, f"{rule.id}: no shipped release in {rule.conditions.sglang}"
    tables = [load_release(v).options for v in releases]
    for flag in list(rule.flags) + [f for f, _ in rule.conditions.flags]:
        having = [t for t in tables if flag in t.by_string]
        assert having, f"{flag} is in no release of {rule.id}'s range"
        if flag not in rule.flags:
            continue
        literal = rule.new_value.text if isinstance(rule.new_value, Literal | Above) else ""
        for value in [*(rule.values or ()), literal]:
            if value:
                assert any(t.by_string[flag].choices is None
                           or value in (t.by_string[flag].choices or ()) for t in having), (
                    f"{value} is a choice of {flag} in no release of {rule.id}'s range")


def _ladder(version: str) -> list[tuple[str, str | None, str | None]]:
    """The fixes the pack makes, one after another, for a CUDA-graph capture OOM on `version`."""
    table = load_release(version).options
    line = ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
            "2.00 GiB")
    flags: dict[str, str | None] = {}
    fired: dict[str, int] = {}
    steps = []
    while True:
        fix = first_fix(MATCHER, line, MatchContext(flags, "unknown", None, version, table),
                        fired)[0]
        if fix is None or fix.flag is None:
            return steps
        steps.append((fix.rule.id, fix.flag, fix.new_value))
        fired[fix.rule.id] = fired.get(fix.rule.id, 0) + 1
        flags[fix.flag] = fix.new_value


@pytest.mark.parametrize("version", ["0.5.10", "0.5.12", "0.5.13", "0.5.18", "0.5.23"])
def test_the_oom_ladder_uses_only_flags_the_release_accepts(version: str) -> None:
    """Each rung is a flag (and value) the running release's parser takes; the ladder ends
    with CUDA graphs off in that release's own spelling."""
    table = load_release(version).options
    steps = _ladder(version)
    assert steps, version
    for _, flag, value in steps:
        assert flag in table.by_string, (version, flag)
        choices = table.by_string[flag].choices
        assert value is None or choices is None or value in choices, (version, flag, value)
    last = steps[-1][1:]
    old = Version(version) < Version("0.5.14")
    assert last == (("--disable-cuda-graph", None) if old
                    else ("--cuda-graph-backend-decode", "disabled")), (version, steps)
    # 0.5.23 never gets the ambiguous prefix or the deprecated switch.
    if version == "0.5.23":
        assert {f for _, f, _ in steps}.isdisjoint({"--cuda-graph-max-bs", "--disable-cuda-graph"})


def _ctx(flags: dict[str, str | None], sm: int | None = None) -> MatchContext:
    return MatchContext(flags=flags, arch="unknown", sm=sm, sglang_version="0.5.23")


def _fix(line: str, ctx: MatchContext, fired: dict[str, int] | None = None) -> Fix | None:
    return first_fix(MATCHER, line, ctx, fired or {})[0]


def test_cutedsl_on_a_llama_drops_the_flag() -> None:
    fix = _fix(
        "ValueError: CuteDSL MLA backend is only supported on Blackwell GPUs (SM100). "
        "Please use a different backend.",
        _ctx({"--attention-backend": "cutedsl_mla"}),
    )
    assert fix is not None
    assert (fix.action, fix.flag, fix.old_value) == (
        "drop_flag",
        "--attention-backend",
        "cutedsl_mla",
    )


def test_oom_ladder_uses_0_5_23_flags() -> None:
    torch_line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    capture = "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2 GiB"
    flags: dict[str, str | None] = {"--mem-fraction-static": "0.88"}
    fired: dict[str, int] = {}
    seen = []
    for _ in range(8):
        # One failure prints torch's line first and SGLang's wrapper after it. As the machine
        # decides a burst: a rule below zero (the start-phase torch OOM rule) waits for a
        # later line; the wrapper's rule wins; a wrapper whose rules are spent ends the ladder
        # (supervise/machine.py: a fix that did not hold beats a waiting catch-all).
        early = _fix(torch_line, _ctx(flags), fired)
        late, spent = first_fix(MATCHER, capture, _ctx(flags), fired)
        if late is None and spent:
            break
        fix = early if early is not None and early.rule.priority >= 0 else (late or early)
        if fix is None:
            break
        fired[fix.rule.id] = fired.get(fix.rule.id, 0) + 1
        assert fix.flag is not None
        flags[fix.flag] = fix.new_value
        seen.append((fix.flag, fix.new_value))
    assert seen == [
        ("--mem-fraction-static", "0.792"),
        ("--mem-fraction-static", "0.7128"),
        ("--cuda-graph-max-bs-decode", "16"),
        ("--cuda-graph-max-bs-decode", "8"),
        ("--cuda-graph-backend-decode", "disabled"),
    ]


def test_port_in_use_gives_up() -> None:
    line = (
        "[2026-11-29 15:40:02] ERROR:    [Errno 98] error while attempting to bind on "
        "address ('0.0.0.0', 30000): address already in use"
    )
    fix = _fix(line, _ctx({"--port": "30000"}))
    assert fix is not None and fix.action == "give_up" and fix.flag is None
    assert "port" in fix.rule.reason


def test_scheduler_crash_restarts_without_flag_change() -> None:
    line = "[2026-11-29 15:31:02] Scheduler hit an exception: Traceback (most recent call last):"
    fix = _fix(line, _ctx({"--attention-backend": "triton", "--mem-fraction-static": "0.8"}))
    assert fix is not None
    assert (fix.action, fix.flag, fix.new_value) == ("restart", None, None)
    assert fix.rule.priority < 0  # a specific cause later in the burst is preferred


def test_kv_dtype_fix_depends_on_current_value() -> None:
    line = (
        "ValueError: TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, "
        "bf16, or auto."
    )
    fix = _fix(line, _ctx({"--kv-cache-dtype": "bfloat16"}))
    assert fix is not None and fix.new_value == "bf16"
    fix = _fix(line, _ctx({"--kv-cache-dtype": "fp8_e5m2"}))
    assert fix is not None and fix.new_value == "fp8_e4m3"


def test_prefill_only_fix_depends_on_sm() -> None:
    line = (
        "ValueError: --prefill-only-disable-kv-cache currently requires the FA prefill "
        "backend (fa3/fa4), but got prefill backend 'flashinfer'."
    )
    fix90 = _fix(line, _ctx({}, sm=90))
    fix100 = _fix(line, _ctx({}, sm=100))
    assert fix90 is not None and fix90.new_value == "fa3"
    assert fix100 is not None and fix100.new_value == "fa4"


# --- real logs (tests/data/sglang-logs/*.log): each log found is a test -------------------


def _headers(path: Path) -> dict[str, str]:
    heads: dict[str, str] = {}
    for raw in path.read_bytes().splitlines():
        if not raw.startswith(b"# "):
            break
        key, _, value = raw[2:].decode("utf-8", "replace").partition(":")
        heads[key.strip()] = value.strip()
    return heads


def _decide(path: Path) -> tuple[Fix | None, list[str]]:
    """What a supervisor that reads the whole failure burst would pick: the best-priority fix."""
    heads = _headers(path)
    flags = _flags_of(heads.get("command", ""))
    ctx = MatchContext(
        flags=flags, arch="unknown", sm=None, sglang_version=heads.get("sglang") or None
    )
    best: Fix | None = None
    matched: list[str] = []
    for raw in path.read_bytes().splitlines():
        if raw.startswith(b"# "):
            continue
        line = clean(raw, 4096)
        matched += [r.id for r in MATCHER.candidates(line)]
        fix, _ = first_fix(MATCHER, line, ctx, {})
        if fix is not None and (best is None or fix.rule.priority > best.rule.priority):
            best = fix
    return best, matched


def _flags_of(command: str) -> dict[str, str | None]:
    # Enough of argv for these logs: --flag value / --flag=value / bare --flag.
    words = command.split()
    flags: dict[str, str | None] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            nxt = words[i + 1] if i + 1 < len(words) else None
            flags[name] = value if eq else (nxt if nxt and not nxt.startswith("--") else None)
    return flags


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_real_log(path: Path) -> None:
    expect = _headers(path).get("expect-rule")
    best, matched = _decide(path)  # every rule runs over every line, header or not
    if expect is None:
        pytest.skip(f"{path.name} has no '# expect-rule: <id|none>' header (matched {matched})")
    if expect == "none":
        assert best is None, f"{path.name}: {best.rule.id if best else ''} fired"
    else:
        assert expect in RULES, f"{path.name}: unknown rule {expect}"
        assert best is not None and best.rule.id == expect, f"{path.name}: matched {matched}"


def test_sources_cite_lines_that_hold_the_message() -> None:
    root = sglang_src()
    bad = []
    for msg in MESSAGES["message"]:
        cite = re.match(r"(sglang/\S+?):(\d+)", msg["source"])
        if not cite:
            continue
        lines = (root / cite.group(1)).read_text(encoding="utf-8").splitlines()
        cited = lines[int(cite.group(2)) - 1]
        # The longest literal piece of the cited line (quotes in, f-string fields out) must be
        # part of the message as printed.
        pieces = [
            p
            for q in re.findall(r"[\"']([^\"']*)[\"']", cited)
            for p in re.split(r"\{[^}]*\}|\\n", q)
        ]
        # A torch/Python message (an import, say) cites the statement: its last word.
        longest = max(pieces, key=len).strip() if pieces else cited.split()[-1]
        if len(longest) < 8 or longest not in msg["text"]:
            bad.append((msg["source"], longest, msg["text"][:60]))
    assert bad == []


@pytest.mark.parametrize(("version", "want"), [
    ("0.5.13", None),  # no such message, and no --cuda-graph-backend-prefill, before 0.5.14
    ("0.5.18", ("--cuda-graph-backend-prefill", "disabled")),
    ("0.5.23", ("--cuda-graph-backend-prefill", "disabled")),
])
def test_prefill_capture_failure_is_fixed_per_release(version: str,
                                                      want: tuple[str, str] | None) -> None:
    """0.5.18's real CPU failure line (e2e test_e2e_old_release) gets SGLang's advice."""
    table = load_release(version).options
    line = ("RuntimeError: Capture prefill CUDA graph failed: Could not run "
            "'sglang::unified_attention_with_output' with arguments from the 'CPU' backend.")
    fix = first_fix(MATCHER, line, MatchContext({}, "mha", None, version, table), {})[0]
    got = None if fix is None or fix.flag is None else (fix.flag, fix.new_value)
    assert got == want
    if want is not None:
        assert fix is not None and fix.rule.id == "prefill-cuda-graph-capture-failed"
        spec = table.by_string[want[0]]
        assert spec.choices is not None and want[1] in spec.choices


# --- messages of other releases, and the rules added for issue 12 --------------------------

@pytest.mark.parametrize("msg", OTHER["message"], ids=lambda m: f"{m['rule']}@{m['release']}")
def test_each_other_release_message_is_caught_by_its_rule(msg: dict[str, str]) -> None:
    matched = [r.id for r in MATCHER.candidates(clean(msg["text"].encode(), 4096))]
    assert msg["rule"] in matched, f"{msg['text']!r} matched {matched}"
    assert msg["absent_from_0_5_23"] in msg["text"]


def test_other_release_wordings_are_not_in_0_5_23() -> None:
    root = sglang_src()
    pieces = {m["absent_from_0_5_23"] for m in OTHER["message"]}
    found = {
        p
        for path in (root / "sglang").rglob("*.py")
        for p in pieces
        if p in path.read_text(encoding="utf-8", errors="replace")
    }
    assert found == set()


def test_kv_budget_is_raised_just_above_what_sglang_names_and_capped() -> None:
    line = (
        "ValueError: Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static=0.8. Raise --mem-fraction-static above 0.912 (minimum viable = "
        "1 - available/pre = 0.9113). If using speculative decoding, draft weights are now counted."
    )
    fix = _fix(line, _ctx({"--mem-fraction-static": "0.8"}))
    assert fix is not None and (fix.rule.id, fix.new_value) == ("kv-no-memory-raise-above", "0.922")
    # SGLang needs more than the cap: no fix (the guard gives up), never a futile raise.
    assert _fix(line.replace("above 0.912", "above 0.97"), _ctx({})) is None


def test_capture_failure_under_torch_compile_drops_it_but_oom_takes_the_ladder() -> None:
    flags: dict[str, str | None] = {"--enable-torch-compile": None, "--mem-fraction-static": "0.8"}
    fix = _fix("Exception: Capture cuda graph failed: ", _ctx(flags))
    assert fix is not None and (fix.action, fix.flag) == ("drop_flag", "--enable-torch-compile")
    fix = _fix("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2 GiB",
               _ctx(flags))
    assert fix is not None and fix.flag == "--mem-fraction-static"
    assert _fix("Exception: Capture cuda graph failed: ", _ctx({})) is None


def test_hybrid_gdn_gate_rewrites_to_a_listed_backend() -> None:
    line = ("AssertionError: Only {'trtllm_mha', 'triton', 'fa4'} backends are supported on "
            "Blackwell GPUs for hybrid GDN models. Got attention_backend=flashinfer.")
    fix = _fix(line, _ctx({"--attention-backend": "flashinfer"}))
    assert fix is not None and (fix.flag, fix.new_value) == ("--attention-backend", "triton")
    fix = _fix(line, _ctx({}))
    assert fix is not None and (fix.action, fix.new_value) == ("set_flag", "triton")


def test_vision_fa3_on_blackwell_without_a_flag_picks_by_sm() -> None:
    line = "ValueError: The 'fa3' backend is not supported on Blackwell GPUs"
    assert (fix := _fix(line, _ctx({}, sm=100))) is not None and fix.new_value == "fa4"
    assert (fix := _fix(line, _ctx({}, sm=103))) is not None and fix.new_value == "triton_attn"
    # The flag given: drop it first, SGLang's own default chooses again.
    fix = _fix(line, _ctx({"--mm-attention-backend": "fa3"}, sm=100))
    assert fix is not None and (fix.action, fix.flag) == ("drop_flag", "--mm-attention-backend")


def test_speculative_constraints_take_sglangs_advice() -> None:
    flags: dict[str, str | None] = {"--speculative-eagle-topk": "4", "--page-size": "64"}
    fix = _fix("ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding.",
               _ctx(flags))
    assert fix is not None and (fix.flag, fix.new_value) == ("--speculative-eagle-topk", "1")
    fix = _fix(
        "ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported on "
        "('flashinfer', 'fa3', 'triton'); got attention_backend='trtllm_mla'. Use page_size == 1 "
        "or one of those backends.",
        _ctx(flags),
    )
    assert fix is not None and (fix.flag, fix.new_value) == ("--page-size", "1")


def test_no_peer_access_disables_the_custom_all_reduce() -> None:
    fix = _fix("RuntimeError: CUDART error: peer access is not supported between these two devices",
               _ctx({"--tp-size": "2"}))
    assert fix is not None and (fix.action, fix.flag, fix.new_value) == (
        "set_flag", "--disable-custom-all-reduce", None)
    assert _fix("RuntimeError: CUDART error: peer access is not supported between these two "
                "devices", _ctx({"--disable-custom-all-reduce": None})) is None


def test_release_ranges_limit_rules_to_the_releases_that_print_their_message() -> None:
    old = ("ValueError: TRTLLM MHA backend for prefill is only supported on Blackwell GPUs "
           "(SM100). Please use a different prefill backend.")
    flags: dict[str, str | None] = {"--attention-backend": "trtllm_mha"}

    def at(version: str | None) -> Fix | None:
        ctx = MatchContext(flags=flags, arch="unknown", sm=None, sglang_version=version)
        return first_fix(MATCHER, old, ctx, {})[0]

    assert (fix := at("0.5.18")) is not None and fix.action == "drop_flag"
    assert at("0.5.23") is None and at("0.5.9") is None
    assert at(None) is not None  # an unknown release never excludes a rule
    kv = ("ValueError: Loaded weights leave no GPU memory for the KV cache under "
          "--mem-fraction-static=0.8. Raise --mem-fraction-static above 0.912 (minimum")
    ctx = MatchContext(flags={}, arch="unknown", sm=None, sglang_version="0.5.13")
    assert first_fix(MATCHER, kv, ctx, {})[0] is None


def test_real_kv_budget_failure_is_raised_to_what_sglang_names() -> None:
    """Real SGLang 0.5.23 on CPU with --mem-fraction-static 0.01 (tests/data/sglang-logs)."""
    path = DATA / "sglang-logs" / "llama-mem-fraction-low.log"
    lines = [clean(raw, 4096) for raw in path.read_bytes().splitlines()
             if not raw.startswith(b"# ")]
    cl = parse_command_line(("--model-path", "/m", "--mem-fraction-static", "0.01"),
                            load_option_table())
    fix = replay(lines, env_for(MATCHER, load_option_table(), sglang_version="0.5.23"), cl)
    assert fix is not None and (fix.rule.id, fix.new_value) == ("kv-no-memory-raise-above", "0.048")
