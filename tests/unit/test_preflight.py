"""Preflight: policies, verdicts, YAML-borne flags, draft models, determinism."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_guard.config.guardconfig import PolicyConfig
from sglang_guard.preflight.compat import CompatTable, load_default_table
from sglang_guard.preflight.facts import GpuFacts, ModelFacts
from sglang_guard.preflight.preflight import Decision, preflight
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.edits import derived_path_for
from sglang_guard.sglang.options import OptionTable

DERIVED = "/state/derived"
LLAMA = ModelFacts("/m", ("LlamaForCausalLM",), "mha", "llama")
DSV3 = ModelFacts("/d", ("DeepseekV3ForCausalLM",), "mla", "deepseek_v3")
UNKNOWN = ModelFacts("org/x", (), "unknown", None, "cannot resolve hub model")
H100 = GpuFacts(sm=90, name="H100", source="nvml")
A100 = GpuFacts(sm=80, source="override")
NO_GPU = GpuFacts(sm=None, source="none")
UNKNOWN_GPU = GpuFacts(sm=None, source="unknown", warning="no NVIDIA driver")


@pytest.fixture(scope="module")
def compat() -> CompatTable:
    return load_default_table()


def _run(options: OptionTable, compat: CompatTable, argv: list[str], *,
         model: ModelFacts = LLAMA, draft: ModelFacts | None = None, gpu: GpuFacts = H100,
         policy: PolicyConfig | None = None, yaml_data: dict[str, Any] | None = None) -> Decision:
    cl = parse_command_line(argv, options, yaml_data)
    return preflight(cl, options, compat, model=model, draft=draft, gpu=gpu,
                     policy=policy or PolicyConfig(), derived_dir=DERIVED)


BASE = ["--model-path", "/m", "--host", "a b"]


@pytest.mark.parametrize(
    ("mode", "verdict", "action", "argv_out"),
    [
        ("drop", "remediated", "drop", BASE),
        ("rewrite", "remediated", "rewrite", [*BASE, "--attention-backend", "fa3"]),
        ("fail", "refused", "refuse", [*BASE, "--attention-backend", "flashmla"]),
        ("warn", "ok", "warn", [*BASE, "--attention-backend", "flashmla"]),
    ],
)
def test_policies_on_an_mla_backend_for_llama(
    options: OptionTable, compat: CompatTable, *, mode: str, verdict: str, action: str,
    argv_out: list[str]
) -> None:
    argv = [*BASE, "--attention-backend", "flashmla"]
    d = _run(options, compat, argv, policy=PolicyConfig(mode))  # type: ignore[arg-type]
    assert d.verdict == verdict
    assert list(d.argv_out) == argv_out
    assert list(d.argv_in) == argv
    assert [(f.flag, f.value, f.action, f.kind) for f in d.findings] == [
        ("--attention-backend", "flashmla", action, "arch")]
    f = d.findings[0]
    assert "MLA" in f.reason
    assert f.new_value == ("fa3" if mode == "rewrite" else None)
    assert set(f.as_dict()) >= {"flag", "value", "action", "new_value", "reason"}


def test_fitting_backend_is_ok(options: OptionTable, compat: CompatTable) -> None:
    argv = [*BASE, "--attention-backend", "fa3"]
    d = _run(options, compat, argv)
    assert (d.verdict, d.findings, list(d.argv_out)) == ("ok", (), argv)


def test_no_backend_flag_is_ok(options: OptionTable, compat: CompatTable) -> None:
    d = _run(options, compat, BASE, model=UNKNOWN, gpu=UNKNOWN_GPU)
    assert d.verdict == "ok"
    assert "cannot resolve hub model" in d.warnings
    assert "no NVIDIA driver" in d.warnings


def test_per_flag_override_beats_default(options: OptionTable, compat: CompatTable) -> None:
    argv = [*BASE, "--attention-backend", "flashmla", "--decode-attention-backend", "flashmla"]
    policy = PolicyConfig("drop", {"--decode-attention-backend": "fail"})
    d = _run(options, compat, argv, policy=policy)
    assert d.verdict == "refused"
    assert [f.action for f in d.findings] == ["drop", "refuse"]
    assert list(d.argv_out) == argv  # a refusal changes nothing


def test_explicit_rewrite_map(options: OptionTable, compat: CompatTable) -> None:
    argv = [*BASE, "--attention-backend=flashmla"]
    policy = PolicyConfig("rewrite", {}, {"--attention-backend": {"flashmla": "triton"}})
    d = _run(options, compat, argv, policy=policy)
    assert list(d.argv_out) == [*BASE, "--attention-backend=triton"]
    assert "policy.rewrite" in d.findings[0].reason


def test_explicit_rewrite_that_does_not_fit_drops(options: OptionTable,
                                                  compat: CompatTable) -> None:
    argv = [*BASE, "--attention-backend", "flashmla"]
    policy = PolicyConfig("rewrite", {}, {"--attention-backend": {"*": "trtllm_mla"}})
    d = _run(options, compat, argv, policy=policy)
    assert d.findings[0].action == "drop"
    assert "configured rewrite trtllm_mla does not fit" in d.findings[0].reason
    assert list(d.argv_out) == BASE


def test_unknown_backend_name(options: OptionTable, compat: CompatTable) -> None:
    d = _run(options, compat, [*BASE, "--attention-backend", "fa9"])
    assert [(f.kind, f.action) for f in d.findings] == [("unknown_backend", "drop")]
    assert list(d.argv_out) == BASE
    # argparse would also reject the choice, but the finding already says so
    assert not any("invalid choice" in w for w in d.warnings)


@pytest.mark.parametrize(("extra", "problem"), [
    (["--enable-dp"], "ambiguous option: --enable-dp could match"),
    (["--tp-size", "x"], "argument --tp-size/--tensor-parallel-size: invalid int value: 'x'"),
    (["--mem-fraction-static", "lots"], "invalid float value: 'lots'"),
    (["--attention-backendd", "triton"], "unrecognized arguments: --attention-backendd triton"),
    (["--tokenizer-mode", "fast"], "argument --tokenizer-mode: invalid choice: 'fast'"),
    (["--trust-remote-code=no"], "ignored explicit argument 'no'"),
])
def test_other_parse_problems_are_rejected(options: OptionTable, compat: CompatTable,
                                           extra: list[str], problem: str) -> None:
    for policy in ("drop", "warn", "rewrite"):  # no policy launches what SGLang rejects
        d = _run(options, compat, [*BASE, *extra], policy=PolicyConfig(policy))
        assert d.verdict == "rejected"
        assert list(d.argv_out) == [*BASE, *extra]
        (f,) = [f for f in d.findings if f.kind == "parser"]
        assert f.action == "refuse" and f.flag == extra[0].split("=")[0]
        assert problem in f.reason and problem in (f.sglang_message or "")


def test_unknown_option_names_the_closest(options: OptionTable, compat: CompatTable) -> None:
    d = _run(options, compat, [*BASE, "--attention-backendd", "triton"])
    assert "(did you mean --attention-backend?)" in d.findings[0].reason
    assert d.findings[0].sglang_message == \
        "error: unrecognized arguments: --attention-backendd triton"


def test_a_flag_the_release_renamed_gets_its_new_spelling(options: OptionTable,
                                                          compat: CompatTable) -> None:
    # Ambiguous in 0.5.23 (issue 11): SGLang 0.5.20 renamed it, the value is kept.
    d = _run(options, compat, [*BASE, "--cuda-graph-max-bs", "8"])
    assert d.verdict == "remediated"
    assert d.argv_out[-2:] == ("--cuda-graph-max-bs-decode", "8")
    (f,) = d.findings
    assert (f.flag, f.value, f.action, f.kind) == ("--cuda-graph-max-bs", "8", "rewrite", "renamed")
    assert not any("ambiguous" in w for w in d.warnings)


def test_non_fatal_problem_is_a_warning(options: OptionTable, compat: CompatTable) -> None:
    argv = [*BASE, "--attention-backend", "nsa"]
    d = _run(options, compat, argv, model=DSV3)
    assert (d.verdict, d.findings) == ("ok", ())
    assert any("deprecated" in w for w in d.warnings)


def test_no_gpu_host_sees_platform_problems(options: OptionTable,
                                            compat: CompatTable) -> None:
    d = _run(options, compat, [*BASE, "--attention-backend", "fa3"], gpu=NO_GPU,
             policy=PolicyConfig("rewrite"))
    assert d.findings[0].kind == "platform"
    assert d.findings[0].new_value == "triton"


def test_unknown_arch_skips_arch_checks(options: OptionTable, compat: CompatTable) -> None:
    d = _run(options, compat, [*BASE, "--attention-backend", "flashmla"], model=UNKNOWN)
    assert d.verdict == "ok"


def test_draft_flag_is_checked_against_the_draft(options: OptionTable,
                                                 compat: CompatTable) -> None:
    argv = [*BASE, "--speculative-draft-attention-backend", "flashmla"]
    assert _run(options, compat, argv, model=DSV3, draft=DSV3).verdict == "ok"
    d = _run(options, compat, argv, model=DSV3, draft=LLAMA)
    assert [(f.flag, f.kind) for f in d.findings] == [
        ("--speculative-draft-attention-backend", "arch")]
    # without a draft model the target's facts are used
    assert _run(options, compat, argv, model=DSV3).verdict == "ok"


def test_yaml_borne_flag_gives_a_derived_yaml(options: OptionTable,
                                              compat: CompatTable) -> None:
    user = {"attention-backend": "flashmla", "port": 30000}
    argv = ["--config", "/etc/s.yaml", *BASE]
    d = _run(options, compat, argv, yaml_data=user)
    assert d.verdict == "remediated"
    assert d.derived_yaml == {"port": 30000}
    assert d.derived_path == derived_path_for({"port": 30000}, DERIVED)
    assert list(d.argv_out) == ["--config", d.derived_path, *BASE]
    assert user == {"attention-backend": "flashmla", "port": 30000}


def test_yaml_borne_flag_rewritten(options: OptionTable, compat: CompatTable) -> None:
    d = _run(options, compat, ["--config", "s.yaml", *BASE], policy=PolicyConfig("rewrite"),
             yaml_data={"attention-backend": "flashmla"})
    assert d.derived_yaml == {"attention-backend": "fa3"}


def test_drop_removes_cli_and_yaml(options: OptionTable, compat: CompatTable) -> None:
    # the YAML value is overridden by the CLI one; both must go, or the YAML one takes over
    d = _run(options, compat, ["--config", "s.yaml", *BASE, "--attention-backend", "flashmla"],
             yaml_data={"attention-backend": "flashmla"})
    assert d.derived_yaml == {}
    assert list(d.argv_out) == ["--config", d.derived_path, *BASE]


def test_refusal_keeps_no_derived_yaml(options: OptionTable, compat: CompatTable) -> None:
    d = _run(options, compat, ["--config", "s.yaml", *BASE], policy=PolicyConfig("fail"),
             yaml_data={"attention-backend": "flashmla"})
    assert (d.verdict, d.derived_yaml, d.derived_path) == ("refused", None, None)


def test_deterministic(options: OptionTable, compat: CompatTable) -> None:
    argv = ["--config", "s.yaml", *BASE, "--decode-attention-backend", "flashmla"]
    runs = [_run(options, compat, argv, policy=PolicyConfig("rewrite"),
                 yaml_data={"attention-backend": "flashmla", "tp-size": 2}) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert runs[0].derived_path is not None


def test_help_is_rejected_without_an_invented_sglang_message(options: OptionTable,
                                                              compat: CompatTable) -> None:
    d = _run(options, compat, [*BASE, "--help"])
    assert d.verdict == "rejected"
    assert d.findings[0].flag == "--help" and d.findings[0].sglang_message is None


def test_yaml_and_cli_unknowns_are_listed_together_as_argparse_does(
        options: OptionTable, compat: CompatTable) -> None:
    d = _run(options, compat, ["--config", "/c.yaml", *BASE, "--nope", "1"],
             yaml_data={"no-such-key": 3})
    assert d.verdict == "rejected"
    assert [f.flag for f in d.findings if f.kind == "parser"] == ["--no-such-key", "--nope"]
    assert d.findings[0].sglang_message == "error: unrecognized arguments: --no-such-key 3 " \
                                           "--nope 1"
