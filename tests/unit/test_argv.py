"""The SGLang command-line reader, checked against a real argparse parser built from the table."""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import pytest

from sglang_guard.errors import InputError
from sglang_guard.resources import config_path
from sglang_guard.sglang.argv import find_config_path, parse_command_line, yaml_tokens
from sglang_guard.sglang.options import OptionTable


class _Rejected(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # type: ignore[override]
        raise _Rejected(message)

    def print_help(self, file: Any = None) -> None:
        """`-h` still exits (a line SGLang would not launch); it just prints nothing here."""


def _checked(convert: Any) -> Any:
    def check(value: str) -> str:
        convert(value)  # ValueError: argparse's "invalid int value"
        return value
    check.__name__ = convert.__name__
    return check


def _oracle() -> argparse.ArgumentParser:
    """argparse as SGLang builds it (default add_help, abbreviations on), from the JSON dump."""
    data = json.loads(config_path("sglang", "options-0.5.23.json").read_text(encoding="utf-8"))
    parser = _Parser(prog="sglang serve", argument_default=argparse.SUPPRESS)
    for o in data["options"]:
        kw: dict[str, Any] = {"dest": o["dest"]}
        if o["nargs"] == 0:
            kw.update(action="store_const", const=True)
        else:
            kw.update(nargs=o["nargs"], choices=o["choices"])
            if o.get("type"):  # argparse's type check; the value stays the string given
                kw["type"] = _checked({"int": int, "float": float}[o["type"]])
        parser.add_argument(*o["strings"], **kw)
    return parser


ORACLE = _oracle()


def _oracle_values(argv: list[str]) -> dict[str, str | None] | None:
    """dest -> value string (None for flags), or None when argparse rejects the line."""
    try:
        ns = ORACLE.parse_args(argv)
    except (_Rejected, SystemExit):
        return None
    out: dict[str, str | None] = {}
    for dest, value in vars(ns).items():
        if value is True:
            out[dest] = None
        elif isinstance(value, list):
            out[dest] = " ".join(value) if value else None
        else:
            out[dest] = value
    return out


def _guard_values(argv: list[str], options: OptionTable) -> dict[str, str | None] | None:
    cl = parse_command_line(argv, options)
    if cl.problems:
        return None
    out: dict[str, str | None] = {}
    for occ in cl.occurrences:
        assert occ.spec is not None
        out[occ.spec.dest] = occ.value
    return out


# Tokens chosen to exercise every branch of argparse's option matching.
_OPTIONS = [
    "--model-path", "--model", "--mod", "--model-p", "--attention-backend", "--attention-back",
    "--prefill-attention-backend", "--decode-attention-backend", "--speculative-draft-model",
    "--speculative-draft-model-path", "--tp", "--tp-size", "--tensor-parallel-size",
    "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--trust-remote-code", "--trust",
    "--port", "--host", "--kv-cache-dtype", "--numa-node", "--gc-threshold",
    "--uvicorn-access-log-exclude-prefixes", "--model-checksum", "--enable-tf32-matmul",
    "--no-enable-tf32-matmul", "--log-level", "--api-key", "--ep", "--ep-size", "--nope",
    "-x", "--enable-hicache", "--load-format", "--lora-target-modules", "--monokernel-backend",
    "--", "-h", "--enable-tf32", "--conf", "--speculative-draft",
]  # fmt: skip
_VALUES = ["/m", "fa3", "flashmla", "triton", "8", "-1", "-1.5", "a b", "auto", "fp8_e4m3",
           "q_proj", "all", "amd", "info", "x=y", "", "--", "-", "-1x", "1e3", "-.5"]  # fmt: skip


def _random_line(rng: random.Random) -> list[str]:
    argv: list[str] = []
    for _ in range(rng.randint(1, 6)):
        opt = rng.choice(_OPTIONS)
        roll = rng.random()
        if roll < 0.2:
            # `--flag=--` is left out: Python 3.11 strips the `--` and stores None, a quirk
            # (fixed in later Pythons) that no real command line depends on.
            argv.append(f"{opt}={rng.choice([v for v in _VALUES if v != '--'])}")
            continue
        argv.append(opt)
        argv += [rng.choice(_VALUES) for _ in range(rng.choice((0, 1, 1, 1, 2)))]
    return argv


FIXED = [
    ["--model", "/m", "--model-path", "/n"],
    ["--mod", "/m"],
    ["--model-p=/m"],
    ["--cuda-graph-max-bs", "8"],
    ["--cuda-graph-max-bs-d", "8"],
    ["--trust-remote-code", "x"],
    ["--trust-remote-code=1"],
    ["--numa-node", "0", "1", "--port", "1"],
    ["--numa-node"],
    ["--numa-node=0", "1"],
    ["--uvicorn-access-log-exclude-prefixes"],
    ["--uvicorn-access-log-exclude-prefixes", "/a", "/b"],
    ["--model-checksum"],
    ["--model-checksum", "abc"],
    ["--port", "-1"],
    ["--port", "-x"],
    ["--host", "a b"],
    ["--attention-backend", "fa3", "--attention-backend", "triton"],
    ["--attention-backend"],
    ["--tp", "2"],
    ["--ep", "2"],
    ["--no-enable-tf32-matmul"],
    ["--kv-cache-dtype", "bogus"],
    ["--", "--port", "1"],
    ["--port", "--", "1"],
    ["--model-path", "/m", "--", "x"],
    ["--trust-remote-code", "--", "x"],
    ["--help"],
    ["-h"],
    ["--he"],
    ["--h", "x"],
    ["-"],
    ["x"],
    [],
    ["--monokernel-backend", "amd"],
    ["--lora-target-modules", "q_proj", "bad"],
]


@pytest.mark.parametrize("argv", FIXED, ids=lambda a: " ".join(a) or "<empty>")
def test_fixed_lines_match_argparse(argv: list[str], options: OptionTable) -> None:
    assert _guard_values(argv, options) == _oracle_values(argv)


def test_random_lines_match_argparse(options: OptionTable) -> None:
    rng = random.Random(20250523)  # noqa: S311 - reproducible test data, not crypto
    mismatches = []
    for _ in range(3000):
        argv = _random_line(rng)
        got, want = _guard_values(argv, options), _oracle_values(argv)
        if got != want:
            mismatches.append((argv, got, want))
    assert mismatches == []


# --- positions: edits depend on them ---------------------------------------------------


def test_occurrence_positions(options: OptionTable) -> None:
    argv = ["--model", "/m", "--numa-node", "0", "1", "--attention-backend=fa3", "--trust-remote"]
    cl = parse_command_line(argv, options)
    got = [(o.spec.dest if o.spec else None, o.index, o.count, o.option, o.values, o.inline)
           for o in cl.occurrences]
    assert got == [
        ("model_path", 0, 2, "--model", ("/m",), False),
        ("numa_node", 2, 3, "--numa-node", ("0", "1"), False),
        ("attention_backend", 5, 1, "--attention-backend", ("fa3",), True),
        ("trust_remote_code", 6, 1, "--trust-remote", (), False),
    ]
    assert cl.value("model_path") == "/m"
    assert cl.present("trust_remote_code")
    assert cl.effective()["--model-path"] == "/m"


def test_ambiguous_prefix_is_a_problem(options: OptionTable) -> None:
    cl = parse_command_line(["--cuda-graph-max-bs", "8"], options)
    assert cl.problems[0] == ("ambiguous option: --cuda-graph-max-bs could match "
                              "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill")
    assert cl.value("cuda_graph_max_bs_decode") is None


# --- --config: SGLang's ConfigArgumentMerger -------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], None),
        (["--port", "1"], None),
        (["--config", "a.yaml"], "a.yaml"),
        (["--config", "a.YML", "--port", "1"], "a.YML"),
        (["--config=a.yaml"], None),  # the merger looks for the exact token only
        (["--conf", "a.yaml"], None),
    ],
)
def test_find_config_path(argv: list[str], expected: str | None) -> None:
    assert find_config_path(argv) == expected


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--config", "a.yaml", "--config", "b.yaml"], "more than once"),
        (["--port", "1", "--config"], "needs a YAML file"),
        (["--config", "a.json"], ".yaml/.yml"),
        (["--config", "yaml"], ".yaml/.yml"),
    ],
)
def test_find_config_path_errors(argv: list[str], needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        find_config_path(argv)


def test_yaml_values_come_first_and_cli_wins(options: OptionTable) -> None:
    yaml_data = {"attention-backend": "fa3", "port": 30001, "trust-remote-code": True}
    argv = ["--port", "1", "--config", "s.yaml", "--attention-backend", "triton"]
    cl = parse_command_line(argv, options, yaml_data)
    assert [o.origin for o in cl.occurrences] == ["yaml", "yaml", "yaml", "cli", "cli"]
    assert cl.value("attention_backend") == "triton"
    assert cl.value("port") == "1"
    assert cl.last("trust_remote_code") is not None
    assert cl.last("trust_remote_code").origin == "yaml"  # type: ignore[union-attr]
    # CLI indices point into the user's argv, --config and its file skipped
    cli = [o for o in cl.occurrences if o.origin == "cli"]
    assert [(o.index, o.count) for o in cli] == [(0, 2), (4, 2)]


@pytest.mark.parametrize(
    ("data", "tokens"),
    [
        ({"trust-remote-code": True}, ["--trust-remote-code"]),
        ({"trust-remote-code": False}, []),
        ({"enable-hicache": True}, ["--enable-hicache"]),  # alias spelling of a store_true
        ({"disable-radix-cache": True}, ["--disable-radix-cache"]),
        ({"kv-cache-dtype": False}, ["--kv-cache-dtype", "false"]),
        ({"numa-node": [0, 1]}, ["--numa-node", "0", "1"]),
        ({"numa-node": []}, []),
        ({"json-model-override-args": {"a": 1}}, ["--json-model-override-args", '{"a": 1}']),
        ({"port": 8}, ["--port", "8"]),
        ({"no-such-flag": 1}, ["--no-such-flag", "1"]),
    ],
)
def test_yaml_tokens_like_config_merger(
    data: dict[str, Any], tokens: list[str], options: OptionTable
) -> None:
    assert [t for _, toks in yaml_tokens(data, options) for t in toks] == tokens


def test_yaml_tokens_match_sglang_merger(options: OptionTable) -> None:
    """The same dict through SGLang's own merger logic, re-derived from the oracle parser."""
    data = {"trust_remote_code": True, "tp-size": 2, "numa-node": [1, 2], "enable-hicache": True,
            "is-embedding": False, "json-model-override-args": {"x": [1]}}
    store_true = {k for a in ORACLE._actions if isinstance(a, argparse._StoreConstAction)
                  and a.nargs == 0 for k in _keys(a)}
    expected: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            if key.replace("-", "_") in store_true:
                expected += [f"--{key}"] if value else []
            else:
                expected += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            expected += [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, dict):
            expected += [f"--{key}", json.dumps(value)]
        else:
            expected += [f"--{key}", str(value)]
    assert [t for _, toks in yaml_tokens(data, options) for t in toks] == expected


def _keys(action: argparse.Action) -> set[str]:
    return {action.dest} | {s[2:].replace("-", "_") for s in action.option_strings
                            if s.startswith("--")}


@pytest.mark.parametrize("key", ["enable-tf32-matmul", "lora_paths", "no-enable-tf32-matmul",
                                 "disable-cuda-graph"])
def test_yaml_unsupported_actions_fail(key: str, options: OptionTable) -> None:
    with pytest.raises(InputError, match="cannot take"):
        yaml_tokens({key: True}, options)


def test_underscore_yaml_key_is_rejected_like_sglang(options: OptionTable) -> None:
    # The merger writes `--model_path`, which argparse does not know (checked against 0.5.23).
    cl = parse_command_line(["--config", "s.yaml"], options, {"model_path": "/m"})
    assert cl.value("model_path") is None
    assert any("--model_path" in p for p in cl.problems)


def test_yaml_problem_names_the_key(options: OptionTable) -> None:
    cl = parse_command_line(["--config", "s.yaml"], options, {"attention-backend": "nope"})
    assert any("YAML key 'attention-backend'" in p for p in cl.problems)


def test_yaml_required_when_config_given(options: OptionTable) -> None:
    with pytest.raises(InputError, match="not loaded"):
        parse_command_line(["--config", "s.yaml"], options)
