"""Secrets never reach a log or the human output, whichever spelling SGLang accepts."""

from __future__ import annotations

import random
import re

import pytest

from sglang_guard.sglang import redact
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.redact import (
    MASK,
    is_secret_dest,
    redact_argv,
    redact_record,
    redact_text,
)

M = MASK


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--api-key", "s3cr3t", "--port", "1"], ["--api-key", M, "--port", "1"]),
        (["--api-key=s3cr3t"], [f"--api-key={M}"]),
        (["--api", "s3cr3t"], ["--api", M]),  # unique prefix
        (["--api-k=s3cr3t"], [f"--api-k={M}"]),
        (["--admin-api-key", "s3cr3t"], ["--admin-api-key", M]),
        (["--admin=s3cr3t"], [f"--admin={M}"]),
        (["--ssl-keyfile-password", "pw"], ["--ssl-keyfile-password", M]),
        (["--ssl-keyfile-p=pw"], [f"--ssl-keyfile-p={M}"]),
        (["--ssl-keyfile", "/k.pem"], ["--ssl-keyfile", "/k.pem"]),  # a path, not a secret
        (["--ssl-keyf", "pw"], ["--ssl-keyf", M]),  # ambiguous with the password flag
        (["--watermark-config", "{\"key\": 1}"], ["--watermark-config", M]),
        (["--watermark-config={}"], [f"--watermark-config={M}"]),
        (["--api-key"], ["--api-key"]),
        (["--model", "/m", "--served-model-name", "hf_abcdefghijklmnop"],
         ["--model", "/m", "--served-model-name", M]),
        (["--json-model-override-args", '{"api_key": "abc"}'],
         ["--json-model-override-args", f'{{"api_key": "{M}"}}']),
        (["--tokenizer-path", "/t", "--max-total-tokens", "8"],
         ["--tokenizer-path", "/t", "--max-total-tokens", "8"]),
    ],
)
def test_redact_argv(options: OptionTable, argv: list[str], expected: list[str]) -> None:
    before = list(argv)
    assert redact_argv(argv, options) == expected
    assert argv == before  # a copy


@pytest.mark.parametrize(
    ("dest", "secret"),
    [("api_key", True), ("admin_api_key", True), ("ssl_keyfile_password", True),
     ("watermark_config", True), ("hf_token", True), ("token", True),
     ("ssl_keyfile", False), ("tokenizer_path", False), ("max_total_tokens", False),
     ("skip_tokenizer_init", False), ("speculative_token_map", False)],
)
def test_is_secret_dest(dest: str, secret: bool) -> None:
    assert is_secret_dest(dest) is secret


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("api_key=abc def", f"api_key={M} def"),
        ("API-KEY: abc", f"API-KEY: {M}"),
        ('{"token": "abc", "x": 1}', f'{{"token": "{M}", "x": 1}}'),
        ("Authorization: Bearer abc.def", f"Authorization: Bearer {M}"),
        ("password=p@ss", f"password={M}"),
        ("using hf_abcdefghijkl now", f"using {M} now"),
        ("key sk-abcdefghijkl", f"key {M}"),
        ("hf_short stays", "hf_short stays"),
        ("nothing to hide", "nothing to hide"),
    ],
)
def test_redact_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://bob:PASS@collector:4317/v1", f"https://{M}@collector:4317/v1"),
        ("--otlp-traces-endpoint=grpc://tok@h:1", f"--otlp-traces-endpoint=grpc://{M}@h:1"),
        ("mail bob@example.com", "mail bob@example.com"),  # not a URL: left as it is
        ('{"secret_access_key": "AKIA1", "bucket": "b"}',
         f'{{"secret_access_key": "{M}", "bucket": "b"}}'),
        ('{"aws_access_key_id": "AKIA1"}', '{"aws_access_key_id": "AKIA1"}'),  # an id, not a key
        ("client_secret=xyz", f"client_secret={M}"),
        ("hf_token: abc", f"hf_token: {M}"),
        ("max_tokens=8 max_total_tokens=9", "max_tokens=8 max_total_tokens=9"),
    ],
)
def test_urls_and_secret_keys_inside_json_are_masked(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_a_record_about_a_secret_flag_hides_its_values() -> None:
    record = {"event": "remediated", "flag": "--api-key", "old_value": "plain-old",
              "new_value": "plain-new", "line": "token=abc",
              "argv_after": ["--otlp-traces-endpoint", "https://u:p@h"],
              "nested": {"k": ["password=pw"]}}
    out = redact_record(record)
    assert out["old_value"] == out["new_value"] == M
    assert out["line"] == f"token={M}"
    assert out["argv_after"] == ["--otlp-traces-endpoint", f"https://{M}@h"]
    assert out["nested"] == {"k": [f"password={M}"]}
    plain = redact_record({"flag": "--mem-fraction-static", "old_value": "0.9",
                           "new_value": "0.8"})
    assert (plain["old_value"], plain["new_value"]) == ("0.9", "0.8")


def test_a_double_dash_does_not_mask_the_next_token(options: OptionTable) -> None:
    # `--` is a prefix of every option, so it looked like an ambiguous secret flag
    assert redact_argv(["--model-path", "m", "--", "x", "api_key=k"], options) == [
        "--model-path", "m", "--", "x", f"api_key={M}"]


def _soup(rng: random.Random) -> str:
    """Text near every part of the inline pattern: its key words in any case and with any
    prefix, token shapes, URLs with and without userinfo, separators and quotes, and
    characters that case-fold onto ASCII ones (the Kelvin sign, the long s, dotted I)."""
    parts = ["api_key", "API-KEY", "apikey", "access-key", "Token", "tokens", "secret",
             "SECRET_VALUE", "password", "passwd", "PassWd", "credentials", "Authorization",
             "bearer ", "hf_", "HF_", "sk-", "SK-", "://", "https://", "user:pw@", "@", "=",
             ":", " ", '"', "'", ",", "}", "max_tokens", "k", "e", "y", "abcdefgh12345678",
             "-", "_", "\u212aey", "\u017fecret", "\u0130", "t\u00f6ken", "\u00e9", "x"]
    return "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))


def test_redact_text_is_the_patterns_own_substitution() -> None:
    """The word pre-check never skips text the pattern would mask: over random soups of the
    pattern's own pieces, ASCII and not, `redact_text` equals the pattern applied to all."""
    pattern = re.compile(redact._INLINE_PATTERN)  # the definition it must equal

    def whole(text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            if m.group("url"):
                return f"{m.group('url')}{MASK}@"
            return MASK if m.group("tok") else m.group("key") + MASK
        return pattern.sub(sub, text)

    rng = random.Random(24)  # noqa: S311 - test data
    changed = 0
    for _ in range(20_000):
        text = _soup(rng)
        assert redact_text(text) == whole(text), text
        changed += whole(text) != text
    assert changed > 2_000  # the soups do reach the pattern
