"""Error-dataset records (schema v2) as rules: pattern, action from exampleFix, advice, refusals.

The seed record (`../shared/seed-error-record.json`, copied to tests/data) is the one the
product was specified from; the other records are small ones written here, each for a real
SGLang 0.5.23 message, to reach one branch of the conversion.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.errors import EXIT_OK, EXIT_USAGE, InputError
from sglang_guard.rules.dataset import (
    Entry,
    build_pattern,
    derive_action,
    import_records,
    read_dataset,
    render_pack,
    sglang_args,
    split_example,
)
from sglang_guard.rules.fixes import Literal
from sglang_guard.rules.packcheck import check_pack
from sglang_guard.rules.rules import (
    MatchContext,
    Matcher,
    Rule,
    RulePack,
    compile_pattern,
    load_default_pack,
    parse_pack,
    plan_fix,
)
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.releases import load_option_table

DATA = Path(__file__).resolve().parent.parent / "data"
SEED = DATA / "seed-error-record.json"
SEED_LINE = "ValueError: cutedsl_mla backend can only be used with MLA models."
CPU_LINE = ("ValueError: CuteDSL MLA backend is only supported on Blackwell GPUs (SM100). "
            "Please use a different backend.")
VERSIONS = ">=0.5.23,<0.5.24"


def record(rid: str, message: str, example: str, **more: Any) -> dict[str, Any]:
    """A small schema-v2 record (the fields the importer reads, plus a few it ignores)."""
    base: dict[str, Any] = {
        "id": rid, "repo": "sgl-project/sglang", "slug": f"test-{rid}",
        "errorMessage": message, "messagePattern": None, "errorClass": "ValueError",
        "severity": "error", "filePath": "python/sglang/srt/x.py", "lineNumber": 10,
        "analyzedSha": "0" * 40, "documentation": f"docs of {rid}",
        "triggerScenarios": "when it happens", "commonSituations": "often",
        "solutions": [f"solution of {rid}"], "exampleFix": example,
        "preventionTips": [f"tip of {rid}"], "schemaVersion": 2,
    }
    return {**base, **more}


def entries(*records: dict[str, Any]) -> list[Entry]:
    text = "\n".join(json.dumps({"record": r, "datasetVersion": "t"}) for r in records)
    return read_dataset(text, "ds.jsonl")


def one_rule(rec: dict[str, Any], options: OptionTable) -> Rule:
    imported = import_records(entries(rec), options)
    assert len(imported.rules) == 1, imported.notes
    return imported.rules[0]


def ctx(flags: dict[str, str | None]) -> MatchContext:
    return MatchContext(flags=flags, arch="unknown", sm=None, sglang_version=None)


def seed_pack(options: OptionTable) -> RulePack:
    imported = import_records(read_dataset(SEED.read_text(), str(SEED)), options)
    return parse_pack(render_pack("seed", VERSIONS, imported, SEED.name), "seed.toml")


# --- the seed record ---------------------------------------------------------------------


def test_the_shipped_copy_is_the_seed_record() -> None:
    shared = Path("/work/shared/seed-error-record.json")
    if shared.is_file():
        assert json.loads(SEED.read_text()) == json.loads(shared.read_text())


def test_the_seed_gives_the_default_packs_cutedsl_rule(options: OptionTable) -> None:
    pack = seed_pack(options)
    assert check_pack(pack, options) is pack
    (rule,) = pack.rules
    default = next(r for r in load_default_pack().rules if r.id == "cutedsl-mla-non-mla-model")
    # Same message: both match SGLang's line, neither matches the GPU check's line on CPU.
    for r in (rule, default):
        assert compile_pattern(r.pattern).search(SEED_LINE)
        assert not compile_pattern(r.pattern).search(CPU_LINE)
    # Same action on the command line the record describes.
    flags = {"--model-path": "/m", "--attention-backend": "cutedsl_mla"}
    mine, theirs = plan_fix(rule, ctx(flags)), plan_fix(default, ctx(flags))
    assert mine is not None and theirs is not None
    assert (mine.action, mine.flag, mine.old_value) == (theirs.action, theirs.flag,
                                                       theirs.old_value)
    assert (mine.action, mine.flag, mine.old_value) == ("drop_flag", "--attention-backend",
                                                        "cutedsl_mla")
    assert rule.record == "954e76c91b6be4af"
    assert rule.source == ("python/sglang/srt/layers/attention/attention_registry.py:104 at "
                           "0132848349585cfe6aae51c4941cbae872505f8a")
    assert rule.solutions[0] == "Drop the explicit backend flag and use auto-selection"
    assert rule.prevention and "MLA models" in rule.explanation


def test_the_seed_pattern_is_anchored_to_the_error_class(options: OptionTable) -> None:
    (rule,) = seed_pack(options).rules
    pattern = compile_pattern(rule.pattern)
    assert pattern.search("[2026-11-29 15:35:53] " + SEED_LINE)
    # The message quoted anywhere but SGLang's own error output does not act.
    assert not pattern.search("INFO: docs say 'cutedsl_mla backend can only be used with "
                              "MLA models.'")


# --- the action from exampleFix ----------------------------------------------------------


def test_a_flag_removed_gives_drop_flag(options: OptionTable) -> None:
    rule = one_rule(record("d1", "hpc_ops backend can only be used with non-MLA models.",
                           "# before\npython -m sglang.launch_server --model-path dsv3 "
                           "--attention-backend hpc_ops\n# after\npython -m "
                           "sglang.launch_server --model-path dsv3\n"), options)
    assert (rule.action, rule.flags, rule.values) == ("drop_flag", ("--attention-backend",),
                                                      ("hpc_ops",))


def test_a_value_changed_gives_rewrite_value(options: OptionTable) -> None:
    rule = one_rule(record(
        "r1", "--kv-cache-dtype=nvfp4 requires Blackwell SM100 or SM120.",
        "# before\nsglang serve --model-path m --kv-cache-dtype nvfp4\n"
        "# after\nsglang serve --model-path m --kv-cache-dtype=fp4_mx_block16  # block-16 FP4\n",
        errorClass="RuntimeError"), options)
    assert (rule.action, rule.flags, rule.values, rule.new_value) == (
        "rewrite_value", ("--kv-cache-dtype",), ("nvfp4",), Literal("fp4_mx_block16"))
    assert rule.pattern.startswith(r"\bRuntimeError: ")


def test_a_flag_added_gives_set_flag(options: OptionTable) -> None:
    rule = one_rule(record(
        "s1", "trtllm_mla backend requires MLA model (use_mla_backend=True).",
        "# before\n--model-path ds --speculative-algorithm EAGLE \\\n"
        "  --speculative-draft-model-path llama-draft\n"
        "# after\n--model-path ds --speculative-algorithm EAGLE \\\n"
        "  --speculative-draft-model-path llama-draft "
        "--speculative-draft-attention-backend triton\n"), options)
    assert (rule.action, rule.flags, rule.new_value) == (
        "set_flag", ("--speculative-draft-attention-backend",), Literal("triton"))
    fix = plan_fix(rule, ctx({"--model-path": "ds"}))
    assert fix is not None and fix.new_value == "triton"


def test_a_bare_flag_added_gives_set_flag_without_a_value(options: OptionTable) -> None:
    action = derive_action("# before\n--model-path m\n# after\n--model-path m "
                           "--disable-cuda-graph\n", options)
    assert (action.action, action.flag, action.new_value) == ("set_flag",
                                                              "--disable-cuda-graph", None)


@pytest.mark.parametrize(("example", "why"), [
    ("# before\n--model-path llama-3 --attention-backend cutedsl_mla\n"
     "# after\n--model-path deepseek-v3 --attention-backend cutedsl_mla\n",
     "a different model"),
    ("# before\n--attention-backend fa3 --mem-fraction-static 0.9\n"
     "# after\n--mem-fraction-static 0.8\n", "changes 2 flags at once"),
    ("# before\n--attention-backend fa3\n# after\n# use a GPU with SM80-90\n", "a comment only"),
    ("# before\n--attention-backend fa3\n# after\n--attention-backend fa3\n", "changes nothing"),
    ("Use --attention-backend triton instead.", "no '# before' and '# after'"),
    ("", "no exampleFix"),
    ("# before\n--api-key a\n# after\n--api-key b\n", "deny list"),
    ("# before\n--attention-backend 'fa3\n# after\n--model-path m\n", "cannot be split"),
    ("# before\n--attention-backend cutlass_mla\n# after\n--model-path m\n",
     "invalid choice: 'cutlass_mla'"),
])
def test_anything_else_gives_advice(options: OptionTable, example: str, why: str) -> None:
    action = derive_action(example, options)
    assert action.action == "advice"
    assert why in action.why


def test_an_advice_rule_keeps_the_record_and_changes_nothing(options: OptionTable) -> None:
    rule = one_rule(record("a1", "FlashAttention v3 Backend requires SM>=80 and SM<=90.",
                           "# before\n--attention-backend fa3\n# after\n# run on an H100\n",
                           errorClass="AssertionError"), options)
    assert rule.action == "advice" and not rule.flags
    assert rule.reason.startswith("no automatic action: ")
    assert rule.solutions == ("solution of a1",) and rule.prevention == ("tip of a1",)
    fix = plan_fix(rule, ctx({"--attention-backend": "fa3"}))
    assert fix is not None and (fix.action, fix.flag, fix.new_value) == ("advice", None, None)


def test_a_flag_the_release_does_not_have_gives_advice_and_a_note(options: OptionTable) -> None:
    rec = record("m1", "DeepSeek-V2 MLA kernels are not available on this platform.",
                 "# before\n--model-path deepseek-v2-lite\n"
                 "# after\n--model-path deepseek-v2-lite --disable-mla\n")
    imported = import_records(entries(rec), options)
    (rule,) = imported.rules
    assert rule.action == "advice"
    assert "names --disable-mla, which SGLang 0.5.23 does not have" in rule.reason
    assert [(n.record, n.skipped) for n in imported.notes] == [("m1", False)]
    assert "--disable-mla" in imported.notes[0].problem


# --- patterns ----------------------------------------------------------------------------


def test_a_pattern_re2_cannot_compile_is_reported_and_skipped(options: OptionTable) -> None:
    bad = record("b1", "aa", "# before\n--attention-backend fa3\n# after\n--model-path m\n",
                 messagePattern=r"(a)\1")
    good = record("g1", "hpc_ops backend can only be used with non-MLA models.",
                  "# before\n--model-path m --attention-backend hpc_ops\n"
                  "# after\n--model-path m\n")
    imported = import_records(entries(bad, good), options)
    assert [r.record for r in imported.rules] == ["g1"]
    (note,) = [n for n in imported.notes if n.record == "b1"]
    assert note.skipped and "not a valid RE2 pattern" in note.problem


def test_a_pattern_is_never_loosened(options: OptionTable) -> None:
    pattern, _ = build_pattern(record("p1", "x", "", messagePattern="^alpha|beta$"))
    assert pattern == r"\bValueError: (?:alpha|beta$)"
    compiled = compile_pattern(pattern or "")
    assert compiled.search("ValueError: beta") and not compiled.search("beta")


def test_without_a_pattern_the_message_is_escaped(options: OptionTable) -> None:
    pattern, _ = build_pattern(record("p2", "a (b) c.", "", errorClass=None))
    compiled = compile_pattern(pattern or "")
    assert compiled.search("x a (b) c.") and not compiled.search("a b c.")


# --- the dataset -------------------------------------------------------------------------


def test_an_unknown_schema_version_is_refused_with_the_record_id() -> None:
    text = json.dumps({"record": {"id": "abc123", "schemaVersion": 3}}) + "\n"
    with pytest.raises(InputError, match=r"line 1: record abc123: schemaVersion 3 is not 2"):
        read_dataset(text, "ds.jsonl")


def test_records_at_the_top_level_are_read_and_bad_json_names_the_line() -> None:
    rec = record("t1", "m", "")
    assert read_dataset(json.dumps(rec) + "\n\n", "ds")[0].record["id"] == "t1"
    with pytest.raises(InputError, match="line 2: not JSON"):
        read_dataset(json.dumps(rec) + "\n{nope\n", "ds")


def test_the_example_sections_and_launcher(options: OptionTable) -> None:
    assert split_example("# Before:\n--a 1\n# AFTER\n--b 2") == ("--a 1", "--b 2")
    assert sglang_args("CUDA_VISIBLE_DEVICES=0 python3 -m sglang.launch_server --x 1 # c") == [
        "--x", "1"]
    assert sglang_args("sglang serve --x 1") == ["--x", "1"]


def test_release_sources_drop_records_whose_message_the_release_lacks(
        options: OptionTable) -> None:
    here = record("h1", "cutedsl_mla backend can only be used with MLA models.",
                  "# before\n--model-path m --attention-backend cutedsl_mla\n"
                  "# after\n--model-path m\n",
                  filePath="python/sglang/srt/layers/attention/attention_registry.py")
    gone = record("g1", "a message of a later release", "", filePath="python/sglang/srt/x.py")
    sources = {here["filePath"]: 'raise ValueError("cutedsl_mla backend can only be used '
                                 'with MLA models.")\n', "python/sglang/srt/x.py": None}
    imported = import_records(entries(here, gone), options, sources)
    assert [r.record for r in imported.rules] == ["h1"]
    assert [(n.record, n.skipped) for n in imported.notes] == [("g1", True)]


def test_duplicate_slugs_get_the_record_id(options: OptionTable) -> None:
    a = record("aa11", "m1", "", slug="same")
    b = record("bb22", "m2", "", slug="same")
    assert [r.id for r in import_records(entries(a, b), options).rules] == ["same", "same-bb22"]


def test_rendered_packs_round_trip_and_pass_the_pack_check(options: OptionTable) -> None:
    recs = [record("q1", 'quote " and \\ and \n newline', "", messagePattern=None),
            record("q2", "hpc_ops backend can only be used with non-MLA models.",
                   "# before\n--model-path m --attention-backend hpc_ops\n"
                   "# after\n--model-path m\n")]
    imported = import_records(entries(*recs), options)
    pack = parse_pack(render_pack("rt", VERSIONS, imported, "ds.jsonl"), "rt.toml")
    check_pack(pack, options)
    assert [(r.id, r.record) for r in pack.rules] == [(r.id, r.record) for r in imported.rules]
    assert pack.rules[0].pattern == imported.rules[0].pattern
    Matcher([pack])  # compiles as the supervisor compiles it


# --- the command -------------------------------------------------------------------------


def test_rules_import_writes_a_pack_explain_shows_the_record(tmp_path: Path) -> None:
    out = tmp_path / "seed.toml"
    result = CliRunner().invoke(main, ["rules", "import", str(SEED), "-o", str(out),
                                       "--sglang-version", VERSIONS])
    assert result.exit_code == EXIT_OK, result.output
    assert "1 rules (1 with an action, 0 advice) from 1 records" in result.output
    config = tmp_path / "guard.toml"
    config.write_text(f"[rules]\ndefault_pack = false\npacks = [{json.dumps(str(out))}]\n")
    log = tmp_path / "server.log"
    log.write_text(f"[2026-11-29] boot\n{CPU_LINE}\n{SEED_LINE}\n")
    result = CliRunner().invoke(main, ["explain", "--json", "--config", str(config), str(log)])
    assert result.exit_code == EXIT_OK, result.output
    (match,) = json.loads(result.output)["matches"]  # the CPU line does not match
    assert match["line_no"] == 3 and match["record"] == "954e76c91b6be4af"
    assert match["action"] == "drop_flag" and match["flags"] == ["--attention-backend"]
    assert match["solutions"][0] == "Drop the explicit backend flag and use auto-selection"
    text = CliRunner().invoke(main, ["explain", "--config", str(config), str(log)]).output
    assert "record: 954e76c91b6be4af" in text and "solution: Drop the explicit" in text


def test_rules_import_refuses_another_schema_and_a_range_without_a_table(
        tmp_path: Path) -> None:
    ds = tmp_path / "ds.jsonl"
    ds.write_text(json.dumps({"record": {**record("z9", "m", ""), "schemaVersion": 1}}) + "\n")
    result = CliRunner().invoke(main, ["rules", "import", str(ds), "--sglang-version", VERSIONS])
    assert result.exit_code == EXIT_USAGE
    assert "record z9: schemaVersion 1 is not 2" in result.output
    result = CliRunner().invoke(main, ["rules", "import", str(SEED), "--sglang-version", ">=0.6"])
    assert result.exit_code == EXIT_USAGE
    assert "holds none of the releases" in result.output
    result = CliRunner().invoke(main, ["rules", "import", str(SEED)])
    assert result.exit_code == EXIT_USAGE


def test_rules_import_reads_the_release_from_an_install(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "sglang-0.5.23.dist-info").mkdir(parents=True)
    (site / "sglang-0.5.23.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.5.23\n")
    src = site / "sglang/srt/layers/attention/attention_registry.py"
    src.parent.mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    src.write_text('        raise ValueError("cutedsl_mla backend can only be used with MLA '
                   'models.")\n')
    result = CliRunner().invoke(main, ["rules", "import", str(SEED), "--sglang-src", str(site)])
    assert result.exit_code == EXIT_OK, result.output
    assert 'sglang_versions = "==0.5.23"' in result.output
    src.write_text("# the message moved away\n")
    result = CliRunner().invoke(main, ["rules", "import", str(SEED), "--sglang-src", str(site)])
    assert result.exit_code == EXIT_USAGE
    assert "does not hold this message" in result.output


def test_the_example_is_read_with_the_release_s_own_table() -> None:
    """0.5.12 has no cutedsl_mla choice: its parser rejects the seed's before command."""
    imported = import_records(read_dataset(SEED.read_text(), str(SEED)),
                              load_option_table("0.5.12"))
    (rule,) = imported.rules
    assert rule.action == "advice"
    assert "SGLang 0.5.12 accepts: argument --attention-backend: invalid choice: " \
           "'cutedsl_mla'" in rule.reason
    result = CliRunner().invoke(main, ["rules", "import", str(SEED), "--sglang-version",
                                       ">=0.5.1,<0.5.13"])
    assert result.exit_code == EXIT_OK and 'action = "advice"' in result.output
