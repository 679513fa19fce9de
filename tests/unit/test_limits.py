"""Input limits (config/limits.py) and the bounded line reader of `explain`
(rules/shell/logstream.py)."""

from __future__ import annotations

import tomllib

import pytest
import yaml

from sglang_guard.config.limits import (
    MAX_DEPTH,
    LimitError,
    check_json,
    toml_loads,
    yaml_safe_load,
)
from sglang_guard.rules.shell.logstream import bounded_lines


def test_json_depth_counts_brackets_outside_strings_only() -> None:
    check_json("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    check_json('{"a": "' + "[" * 10_000 + '"}')  # inside a string: not nesting
    check_json('{"a": "\\"[[["}')
    with pytest.raises(LimitError, match="nested deeper"):
        check_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))


def test_toml_limits_are_decode_errors_and_real_files_pass() -> None:
    assert toml_loads('[[rules]]\nid = "a"\npattern = \'[[[\'\n# [[[[\n') == {
        "rules": [{"id": "a", "pattern": "[[["}]}
    with pytest.raises(tomllib.TOMLDecodeError, match="nested deeper"):
        toml_loads("x = " + "[" * 200 + "]" * 200)


def test_yaml_aliases_are_weighed_as_expanded() -> None:
    assert yaml_safe_load("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}
    bomb = "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
    for prev, name in zip("abcde", "bcdef", strict=True):
        bomb += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]\n"
    with pytest.raises(yaml.YAMLError, match="alias"):
        yaml_safe_load(bomb)
    with pytest.raises(yaml.YAMLError, match="nested deeper"):
        yaml_safe_load("[" * 200 + "]" * 200)


def test_bounded_lines_cut_each_line_and_keep_the_count() -> None:
    chunks = iter([b"ab", b"cdef\nx", b"\n\nlast"])
    assert list(bounded_lines(chunks, 3)) == [b"abc", b"x", b"", b"las"]
    assert list(bounded_lines(iter([b"one\n"]), 10)) == [b"one"]
