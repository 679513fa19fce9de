"""`check` never shows a secret, in its text or its JSON, whichever release and spelling.

Property over every shipped release's option table: each option whose dest is a secret
(`--api-key`, `--admin-api-key`, `--ssl-keyfile-password`, `--watermark-config`, ...) given
in every way argparse takes it (`--flag V`, `--flag=V`, a unique prefix of either), in a
random order among other flags, on the command line and in the `--config` YAML; plus the
secrets that hide in other options' values (URL userinfo, token-shaped words, key=value in a
JSON flag). None of the values may appear in `render_decision`, `decision_json` or the
`check` process's output.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.config.guardconfig import GuardConfig, with_overrides
from sglang_guard.preflight.shell.inputs import prepare
from sglang_guard.preflight.shell.whichrelease import Release
from sglang_guard.sglang.options import OptionSpec, OptionTable
from sglang_guard.sglang.redact import is_secret_dest
from sglang_guard.sglang.releases import known_releases, load_release
from sglang_guard.ui import decision_json, render_decision
from support.models import write_llama

# Secrets inside other options' values: what redact_text must find by shape.
URL_SECRET = "PAss4321url"  # noqa: S105 - test data
HF_SECRET = "hf_zyxwvutsrqponm"  # noqa: S105 - test data
JSON_SECRET = "AKIAJSONSECRET9"  # noqa: S105 - test data
SHAPED = [("--otlp-traces-endpoint", f"https://bob:{URL_SECRET}@collector.example:4317"),
          ("--served-model-name", HF_SECRET),
          ("--json-model-override-args", json.dumps({"secret_access_key": JSON_SECRET}))]


def _secret_specs(table: OptionTable) -> list[OptionSpec]:
    found = [s for s in table.options if is_secret_dest(s.dest) and s.takes_value]
    assert found, f"{table.sglang_version}: no secret option (the property would be empty)"
    return found


def _unique_prefix(table: OptionTable, option: str) -> str | None:
    """The shortest prefix of `option` that argparse reads as it alone (None: there is none)."""
    for n in range(3, len(option)):
        look = table.lookup(option[:n])
        if look.kind == "abbrev" and look.option == option:
            return option[:n]
    return None


def _spellings(table: OptionTable, spec: OptionSpec, value: str) -> list[list[str]]:
    """Every way this release's parser takes `spec` with `value`."""
    out = []
    for option in spec.strings:
        if not option.startswith("--"):
            continue
        for head in filter(None, (option, _unique_prefix(table, option))):
            out += [[head, value], [f"{head}={value}"]]
    return out


def _has_option(table: OptionTable, flag: str) -> bool:
    return table.get(flag) is not None


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_llama(tmp_path_factory.mktemp("llama")))


def _shown(cfg: GuardConfig, argv: list[str], release: Release, state: Path) -> str:
    prepared = prepare(cfg.gpu_sm, cfg.policy, argv, str(state), release)
    assert prepared.decision is not None and prepared.inputs is not None
    return (render_decision(prepared.decision, prepared.inputs) + "\n"
            + json.dumps(decision_json(prepared.decision, prepared.inputs)))


def test_every_secret_option_of_every_release_is_masked(llama: str, tmp_path: Path) -> None:
    cases = 0
    for version in known_releases():
        release = Release(load_release(version), "test")
        table = release.tables.options
        rng = random.Random(version)  # noqa: S311 - reproducible picks
        cfg = with_overrides(GuardConfig(), ("drop", "rewrite", "warn")[cases % 3], "90")
        shaped = [pair for pair in SHAPED if _has_option(table, pair[0])]
        for n, spec in enumerate(_secret_specs(table)):
            value = f"Zq{n}{version.replace('.', '')}hush"  # no shape: masked by its option
            for form in _spellings(table, spec, value):
                pieces = [form, ["--model-path", llama], ["--attention-backend", "flashmla"],
                          *([flag, v] for flag, v in shaped)]
                rng.shuffle(pieces)
                argv = [tok for piece in pieces for tok in piece]
                shown = _shown(cfg, argv, release, tmp_path)
                cases += 1
                for secret in (value, *(URL_SECRET, HF_SECRET, JSON_SECRET)[:len(shaped)]):
                    assert secret not in shown, (version, form, secret, shown)
                assert "--model-path" in shown  # the command line is still shown
    assert cases >= 42 * 4  # every release, each spelling form of --api-key at least


def test_secret_keys_in_the_yaml_config_are_masked(llama: str, tmp_path: Path) -> None:
    release = Release(load_release(known_releases()[-1]), "test")
    table = release.tables.options
    data: dict[str, object] = {"attention-backend": "flashmla"}  # dropped: a derived copy
    for n, spec in enumerate(_secret_specs(table)):
        data[spec.canonical.lstrip("-")] = f"Yaml{n}hush"
    user = tmp_path / "sglang.yaml"
    user.write_text(yaml.safe_dump(data), encoding="utf-8")
    shown = _shown(with_overrides(GuardConfig(), "drop", "90"),
                   ["--model-path", llama, "--config", str(user)], release, tmp_path)
    doc = json.loads(shown.rsplit("\n", 1)[-1])
    assert doc["derived_config"] is not None, shown  # the YAML was read and shown
    assert "hush" not in shown


def test_the_check_process_masks_text_and_json(llama: str) -> None:
    argv = ["--model-path", llama, "--attention-backend", "flashmla", "--api-key", "s3cr3t",
            "--admin-api-key=adm1n", *SHAPED[0]]
    for extra in ((), ("--json",)):
        res = CliRunner().invoke(main, ["check", *extra, "--gpu-sm", "90", "--", *argv],
                                 catch_exceptions=False)
        assert res.exit_code == 1, res.output
        for secret in ("s3cr3t", "adm1n", URL_SECRET):
            assert secret not in res.output
    out = json.loads(res.stdout)
    assert out["argv_in"][4:8] == ["--api-key", "***", "--admin-api-key=***",
                                   "--otlp-traces-endpoint"]
    assert out["argv_out"][-1] == "https://***@collector.example:4317"


@pytest.mark.parametrize("action", ["drop_flag", "set_flag"])
def test_explain_shows_a_secret_flags_values_masked(action: str) -> None:
    """No rule may touch a credential flag (packcheck's deny list), but --watermark-config
    (it carries the watermark key) is not one by name: its values are masked all the same."""
    from types import SimpleNamespace  # noqa: PLC0415

    from sglang_guard.rules.shell.explain import fix_as_dict, render_fix  # noqa: PLC0415
    from sglang_guard.sglang.redact import redact_record  # noqa: PLC0415

    fix = SimpleNamespace(action=action, flag="--watermark-config", old_value='{"key": 7}',
                          new_value='{"key": 8}', free_port=False,
                          rule=SimpleNamespace(id="r", reason="why"))
    line = render_fix(fix)  # type: ignore[arg-type]
    assert "--watermark-config ***" in line and "key" not in line
    shown = json.dumps(redact_record(fix_as_dict(fix)))  # type: ignore[arg-type]
    assert "key" not in shown.replace("new_value", "").replace("old_value", "")
