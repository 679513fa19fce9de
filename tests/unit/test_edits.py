"""Edits keep every other token byte-for-byte and never touch the user's YAML."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.edits import Edit, apply_edits, derived_path_for, dump_yaml
from sglang_guard.sglang.options import OptionTable

DERIVED = "/state/derived"
ODD = ["--host", "a b", "--served-model-name", "é \t$x", "--model", "/m"]


def _edit(options: OptionTable, argv: list[str], *edits: Edit,
          yaml_data: dict[str, Any] | None = None) -> tuple[list[str], Any, Any]:
    cl = parse_command_line(argv, options, yaml_data)
    res = apply_edits(cl, options, edits, DERIVED)
    return list(res.argv), res.derived_yaml, res.derived_path


DROP = Edit("attention_backend", "drop")
SET_TRITON = Edit("attention_backend", "set", "triton")


@pytest.mark.parametrize(
    ("argv", "edit", "expected"),
    [
        # drop: every CLI occurrence, any spelling, `=` or not
        ([*ODD, "--attention-backend", "fa3"], DROP, ODD),
        (["--attention-backend=fa3", *ODD], DROP, ODD),
        (["--attention-back", "fa3", *ODD, "--attention-backend", "x"], DROP, ODD),
        (ODD, DROP, ODD),
        # set: the last occurrence keeps its spelling and form
        ([*ODD, "--attention-backend", "fa3"], SET_TRITON, [*ODD, "--attention-backend", "triton"]),
        (["--attention-back=fa3", *ODD], SET_TRITON, ["--attention-back=triton", *ODD]),
        (["--attention-backend", "fa3", *ODD, "--attention-backend", "flashmla"], SET_TRITON,
         ["--attention-backend", "fa3", *ODD, "--attention-backend", "triton"]),
        # set when absent: appended in canonical spelling
        (ODD, SET_TRITON, [*ODD, "--attention-backend", "triton"]),
        (ODD, Edit("trust_remote_code", "set"), [*ODD, "--trust-remote-code"]),
        # a store_true that is already there stays as it is
        (["--trust-remote-code", *ODD], Edit("trust_remote_code", "set"),
         ["--trust-remote-code", *ODD]),
        # nargs '+': every value token goes with the option
        (["--numa-node", "0", "1", *ODD], Edit("numa_node", "drop"), ODD),
        (["--numa-node", "0", "1", *ODD], Edit("numa_node", "set", "3"),
         ["--numa-node", "3", *ODD]),
    ],
)
def test_cli_edits(options: OptionTable, argv: list[str], edit: Edit,
                   expected: list[str]) -> None:
    out, derived, path = _edit(options, argv, edit)
    assert out == expected
    assert (derived, path) == (None, None)


def test_several_edits_at_once(options: OptionTable) -> None:
    argv = ["--prefill-attention-backend", "fa3", *ODD, "--decode-attention-backend=flashmla"]
    out, _, _ = _edit(options, argv, Edit("prefill_attention_backend", "drop"),
                      Edit("decode_attention_backend", "set", "triton"))
    assert out == [*ODD, "--decode-attention-backend=triton"]


def test_yaml_value_rewritten_in_a_derived_copy(options: OptionTable) -> None:
    user = {"attention-backend": "flashmla", "tp-size": 2, "api-key": "k"}
    before = dict(user)
    argv = ["--model", "/m", "--config", "/etc/s.yaml", "--port", "1"]
    out, derived, path = _edit(options, argv, SET_TRITON, yaml_data=user)
    assert user == before  # the user's data is never changed
    assert derived == {"attention-backend": "triton", "tp-size": 2, "api-key": "k"}
    assert list(derived) == list(user)  # key order kept
    assert path == derived_path_for(derived, DERIVED)
    assert path.startswith(f"{DERIVED}/sglang-config-") and path.endswith(".yaml")
    assert out == ["--model", "/m", "--config", path, "--port", "1"]
    assert yaml.safe_load(dump_yaml(derived)) == derived


def test_yaml_drop_removes_key_and_cli_occurrences(options: OptionTable) -> None:
    user = {"attention-backend": "flashmla", "tp-size": 2}
    argv = ["--attention-backend", "fa3", "--config", "s.yaml"]
    out, derived, path = _edit(options, argv, DROP, yaml_data=user)
    assert derived == {"tp-size": 2}
    assert out == ["--config", path]


def test_cli_value_wins_so_yaml_is_left_alone_on_set(options: OptionTable) -> None:
    user = {"attention-backend": "flashmla"}
    argv = ["--config", "s.yaml", "--attention-backend", "fa3"]
    out, derived, path = _edit(options, argv, SET_TRITON, yaml_data=user)
    assert out == ["--config", "s.yaml", "--attention-backend", "triton"]
    assert (derived, path) == (None, None)


def test_alias_yaml_keys_are_all_dropped(options: OptionTable) -> None:
    user = {"tp-size": 2, "tensor-parallel-size": 4, "port": 1}
    _, derived, _ = _edit(options, ["--config", "s.yml"], Edit("tp_size", "drop"),
                          yaml_data=user)
    assert derived == {"port": 1}


def test_store_true_set_from_yaml(options: OptionTable) -> None:
    user = {"trust-remote-code": True}
    _, derived, _ = _edit(options, ["--config", "s.yaml"], Edit("trust_remote_code", "set"),
                          yaml_data=user)
    assert derived == {"trust-remote-code": True}


def test_derived_path_is_deterministic_and_content_addressed() -> None:
    a = derived_path_for({"x": 1, "y": "z"}, "/d/")
    assert a == derived_path_for({"x": 1, "y": "z"}, "/d")
    assert a != derived_path_for({"y": "z", "x": 1}, "/d")  # order is content for SGLang
    assert a != derived_path_for({"x": 2, "y": "z"}, "/d")


def test_drop_of_absent_flag_changes_nothing(options: OptionTable) -> None:
    out, derived, _ = _edit(options, ["--config", "s.yaml", *ODD], DROP, yaml_data={"port": 1})
    assert out == ["--config", "s.yaml", *ODD]
    assert derived is None


# 0.5.18: four options share dest cuda_graph_backend_prefill; three of them take no value.
OLD = "0.5.18"
SET_PREFILL_OFF = Edit("cuda_graph_backend_prefill", "set", "disabled")


def _old_options() -> OptionTable:
    from sglang_guard.sglang.releases import load_release  # noqa: PLC0415

    return load_release(OLD).options


def test_a_value_is_written_with_the_option_that_takes_it() -> None:
    """Not with the table's last option for the dest (a store_const alias in 0.5.18)."""
    old = _old_options()
    assert not old.by_dest["cuda_graph_backend_prefill"].takes_value  # the trap itself
    argv, _, _ = _edit(old, ODD, SET_PREFILL_OFF)
    assert argv == [*ODD, "--cuda-graph-backend-prefill", "disabled"]


def test_a_value_less_alias_given_by_the_user_is_replaced() -> None:
    old = _old_options()
    argv, _, _ = _edit(old, ["--enforce-piecewise-cuda-graph", *ODD], SET_PREFILL_OFF)
    assert argv == ["--cuda-graph-backend-prefill", "disabled", *ODD]

