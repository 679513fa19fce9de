"""`check` over every shipped release x a corpus of command lines: a decision or a clear input
error, never an internal error (issue 19, item 1).

The corpus covers every flag family the guard reads (attention/prefill/decode/draft/mm
backends, KV dtypes, parallel sizes, speculative, quantization, memory, ports, `--config`
YAML). Values come from the union of every release's own choice lists, so a value one
release has and another lacks is met on both sides, plus spellings no release has.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_guard.config.guardconfig import GuardConfig, with_overrides
from sglang_guard.errors import GuardError
from sglang_guard.preflight.shell.inputs import prepare
from sglang_guard.preflight.shell.whichrelease import Release
from sglang_guard.sglang.releases import known_releases, load_release
from sglang_guard.ui import decision_json, render_decision
from support.models import write_deepseek_v3, write_llama

BACKEND_DESTS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
                 "speculative_draft_attention_backend", "mm_attention_backend")
FLAG = {d: "--" + d.replace("_", "-") for d in BACKEND_DESTS}
# Spellings no release has: a typo, an empty value, a value with a space.
ALIENS = ("no_such_backend", "", "fa 3")


def _union(dest: str) -> list[str]:
    names: dict[str, None] = {}
    for v in known_releases():
        spec = load_release(v).options.get(dest)
        if spec is not None and spec.choices:
            names.update(dict.fromkeys(spec.choices))
    return sorted(names)


def _fixed_lines(model: str, draft: str, yaml_path: str) -> list[list[str]]:
    """Command lines that do not depend on a release's choice lists."""
    m = ["--model-path", model]
    spec = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", draft,
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
            "--speculative-num-draft-tokens", "8"]
    return [
        m,
        [*m, "--tp-size", "2"], [*m, "--tp", "3"], [*m, "--tp-size", "x"],
        [*m, "--tp-size", "2", "--pp-size", "2", "--nnodes", "3"],
        [*m, "--dp-size", "2", "--enable-dp-attention"], [*m, "--ep-size", "2"],
        [*m, "--moe-dense-tp-size", "3", "--tp-size", "4"],
        [*m, *spec], [*m, *spec, "--attention-backend", "trtllm_mha"],
        [*m, *spec, "--page-size", "16", "--attention-backend", "flashmla"],
        [*m, "--speculative-algorithm", "NEXTN"], [*m, "--speculative-algorithm", "bogus"],
        [*m, "--quantization", "fp8"], [*m, "--quantization", "nvfp4_online"],
        [*m, "--quantization", "not_a_method"], [*m, "--quantization", "w8a8_int8"],
        [*m, "--mem-fraction-static", "0.8"], [*m, "--mem-fraction-static", "lots"],
        [*m, "--max-total-tokens", "4096"], [*m, "--context-length", "1000000"],
        [*m, "--chunked-prefill-size", "100", "--page-size", "64"],
        [*m, "--port", "0"], [*m, "--port", "http"], [*m, "--host", "::1", "--port", "1"],
        [*m, "--kv-cache-dtype"], [*m, "--attention-backend"],
        [*m, "--attention-backendd", "triton"], [*m, "--attn", "triton"],
        [*m, "--", "extra"], [*m, "stray"], [*m, "--trust-remote-code=yes"],
        ["--config", yaml_path], [*m, "--config", yaml_path, "--attention-backend", "fa3"],
        [*m, "--json-model-override-args", "{not json"],
    ]


def _lines(release: str, model: str, draft: str, yaml_path: str,
           rng: random.Random) -> Iterator[list[str]]:
    table = load_release(release).options
    yield from _fixed_lines(model, draft, yaml_path)
    for dest in BACKEND_DESTS:
        spec = table.get(dest)
        own = list(spec.choices or ()) if spec is not None else []
        others = [n for n in _union(dest) if n not in own]
        picks = own + rng.sample(others, min(3, len(others))) + list(ALIENS)
        for value in picks:
            line = ["--model-path", model, FLAG[dest], value]
            if dest == "speculative_draft_attention_backend":
                line += ["--speculative-algorithm", "EAGLE",
                         "--speculative-draft-model-path", draft]
            yield line
    kv = table.get("kv_cache_dtype")
    kv_values = list(kv.choices or ()) if kv is not None else []
    kv_values += [n for n in ("fp4_e2m1", "nvfp4", "mxfp8", "fp8_e4m3", "bf16")
                  if n not in kv_values]
    attn = table.get("attention_backend")
    backends = list(attn.choices or ()) if attn is not None else []
    for value in kv_values:
        yield ["--model-path", model, "--kv-cache-dtype", value]
        for be in rng.sample(backends, min(2, len(backends))):
            yield ["--model-path", model, "--kv-cache-dtype", value, "--attention-backend", be]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    llama = write_llama(tmp_path_factory.mktemp("llama"))
    dsv3 = write_deepseek_v3(tmp_path_factory.mktemp("dsv3"))
    y = tmp_path_factory.mktemp("yaml") / "sglang.yaml"
    y.write_text(yaml.safe_dump({"model-path": str(dsv3), "attention-backend": "flashmla",
                                 "kv-cache-dtype": "fp8_e4m3", "tp-size": 2,
                                 "speculative-draft-attention-backend": "fa3",
                                 "enable-dp-attention": True}), encoding="utf-8")
    return str(llama), str(dsv3), str(y)


def _check(cfg: GuardConfig, argv: list[str], release: Release, state: Path) -> str:
    """What `check` ends in: its verdict, or "input" for a one-line input error."""
    try:
        prepared = prepare(cfg.gpu_sm, cfg.policy, argv, str(state), release)
    except GuardError as exc:
        assert exc.exit_code in (2, 69, 78), (exc.exit_code, str(exc))
        assert "\n" not in str(exc) and str(exc)
        return "input"
    decision, inputs = prepared.decision, prepared.inputs
    assert decision is not None and inputs is not None
    render_decision(decision, inputs)
    decision_json(decision, inputs)
    return decision.verdict


def test_every_release_every_line_decides(models: tuple[str, str, str],
                                          tmp_path: Path) -> None:
    llama, dsv3, yaml_path = models
    outcomes: dict[str, int] = {}
    failures: list[str] = []
    for n, version in enumerate(known_releases()):
        gpu_sm = ("90", "100", "none")[n % 3]  # Hopper, Blackwell, no GPU: each release once
        rng = random.Random(f"{version}-{gpu_sm}")  # noqa: S311 - reproducible picks
        release = Release(load_release(version), "test")
        for policy in (("drop", "rewrite", "fail", "warn")[n % 4],):  # each on ~11 releases
            cfg = with_overrides(GuardConfig(), policy, gpu_sm)
            model = llama if policy in ("drop", "rewrite") else dsv3
            draft = dsv3 if model == llama else llama
            for argv in _lines(version, model, draft, yaml_path, rng):
                try:
                    outcome = _check(cfg, argv, release, tmp_path)
                except Exception as exc:  # what `check` turns into exit 70
                    failures.append(f"{version} {policy} {argv}: {type(exc).__name__}: {exc}")
                    continue
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert not failures, f"{len(failures)} internal errors, e.g.\n" + "\n".join(failures[:10])
    # The corpus reaches every outcome (a corpus that only ever passes proves nothing).
    assert {"ok", "remediated", "refused", "rejected"} <= set(outcomes), outcomes


def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    from click.testing import CliRunner  # noqa: PLC0415

    from sglang_guard.cli import main  # noqa: PLC0415

    args = ("--gpu-sm", "90", *args) if "--gpu-sm" not in args else args
    res = CliRunner().invoke(main, ["check", "--json", *args],
                             catch_exceptions=False)
    return res.exit_code, json.loads(res.stdout)


def test_an_old_release_without_the_draft_flag_decides(models: tuple[str, str, str]) -> None:
    # 0.5.1-0.5.6.post2 have no --speculative-draft-attention-backend (was: KeyError, exit 70)
    rc, out = _cli("--sglang-version", "0.5.3", "--", "--model-path", models[0],
                   "--attention-backend", "triton")
    assert (rc, out["verdict"], out["findings"]) == (0, "ok", [])


@pytest.mark.parametrize(("version", "value", "kind"), [
    ("0.5.23", "fp4_e2m1", "invalid_choice"),  # removed from the choices in 0.5.21
    ("0.5.17", "fp4_e2m1", "renamed_value"),   # parsed, then raises at model load
    ("0.5.15", "nvfp4", "invalid_choice"),
    ("0.5.10", "mxfp8", "invalid_choice"),
])
def test_a_kv_dtype_the_release_rejects_follows_the_policy(
        models: tuple[str, str, str], version: str, value: str, kind: str) -> None:
    argv = ["--model-path", models[0], "--kv-cache-dtype", value]
    rc, out = _cli("--sglang-version", version, "--", *argv)
    assert (rc, out["verdict"], out["argv_out"]) == (1, "remediated", argv[:2])
    assert [(f["kind"], f["action"]) for f in out["findings"]] == [(kind, "drop")]
    assert value in out["findings"][0]["sglang_message"]
    rc, out = _cli("--sglang-version", version, "--policy", "fail", "--", *argv)
    assert (rc, out["verdict"]) == (78, "refused")
    rc, out = _cli("--sglang-version", version, "--policy", "rewrite", "--", *argv)
    renamed = value == "fp4_e2m1"  # SGLang's own successor (kv_cache_dtype.py:59, 0.5.16)
    assert out["argv_out"] == ([*argv[:3], "fp4_mx_block16"] if renamed else argv[:2])


@pytest.mark.parametrize("version", ["0.5.3", "0.5.14", "0.5.23"])
@pytest.mark.parametrize(("extra", "needle"), [
    (["--tp-size", "x"], "invalid int value: 'x'"),
    (["--attention-backendd", "triton"], "unrecognized arguments: --attention-backendd triton"),
    (["--port", "http"], "invalid int value: 'http'"),
])
def test_a_line_the_parser_rejects_is_rejected(models: tuple[str, str, str], version: str,
                                               extra: list[str], needle: str) -> None:
    rc, out = _cli("--sglang-version", version, "--", "--model-path", models[0], *extra)
    assert (rc, out["verdict"]) == (2, "rejected")
    assert needle in out["findings"][0]["sglang_message"]


@pytest.mark.parametrize("kv", [[], ["--kv-cache-dtype", "auto"]])
def test_an_absent_kv_dtype_is_checked_as_the_releases_default(
        models: tuple[str, str, str], kv: list[str]) -> None:
    # SGLang 0.5.22 fails it: "tokenspeed_mla backend requires kv-cache-dtype=fp8_e4m3, got
    # auto" (the default); the same decision with the default written out and left out.
    argv = ["--model-path", models[1], "--attention-backend", "tokenspeed_mla", *kv]
    rc, out = _cli("--sglang-version", "0.5.22", "--gpu-sm", "100", "--", *argv)
    assert (rc, out["verdict"]) == (1, "remediated")
    (f,) = out["findings"]
    assert (f["flag"], f["action"], f["kind"]) == ("--attention-backend", "drop",
                                                   "kv_cache_dtype")
    assert f["sglang_message"].endswith("got auto.")
    assert ("is SGLang 0.5.22's default" in f["reason"]) == (not kv)
    rc, out = _cli("--sglang-version", "0.5.22", "--gpu-sm", "100", "--", *argv,
                   "--kv-cache-dtype", "fp8_e4m3")
    assert (rc, out["verdict"]) == (0, "ok")


def test_every_release_table_knows_the_kv_default() -> None:
    for version in known_releases():
        spec = load_release(version).options.get("kv_cache_dtype")
        assert spec is not None and (spec.has_default, spec.default) == (True, "auto"), version


def test_a_backend_flag_the_release_lacks_follows_the_policy(
        models: tuple[str, str, str], tmp_path: Path) -> None:
    llama = models[0]
    argv = ["--model-path", llama, "--speculative-draft-attention-backend", "fa3", "--tp", "1"]
    rc, out = _cli("--sglang-version", "0.5.3", "--", *argv)
    assert (rc, out["verdict"], out["argv_out"]) == (1, "remediated",
                                                     ["--model-path", llama, "--tp", "1"])
    assert [(f["kind"], f["action"]) for f in out["findings"]] == [("absent_option", "drop")]
    rc, out = _cli("--sglang-version", "0.5.3", "--policy", "fail", "--", *argv)
    assert (rc, out["verdict"]) == (78, "refused")
    # From the --config YAML: the key is left out of a derived copy.
    y = tmp_path / "s.yaml"
    y.write_text(yaml.safe_dump({"speculative-draft-attention-backend": "fa3", "tp-size": 1}))
    rc, out = _cli("--sglang-version", "0.5.3", "--state-dir", str(tmp_path / "st"), "--",
                   "--model-path", llama, "--config", str(y))
    assert (rc, out["verdict"]) == (1, "remediated")
    assert out["derived_config"] == {"tp-size": 1}
    # The release that has it: nothing to say.
    rc, out = _cli("--sglang-version", "0.5.23", "--", *argv)
    assert (rc, out["verdict"]) == (0, "ok")
