"""Hide secrets (API keys, tokens) in everything the guard logs or prints."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sglang_guard.sglang.options import OptionTable

MASK = "***"
# dest names whose values are secrets: --api-key, --admin-api-key, hub tokens, passwords...
# and --watermark-config, which carries the watermark key (SGLang 0.5.23 redacts it itself:
# sglang/srt/sampling/watermarking/core.py:110-134).
_SECRET_DEST = re.compile(
    r"(api_key$|password|passwd|secret|credential|^(hf_|auth_|access_)?token$|^watermark_config$)"
)
# Secrets that show up inside free text (a log line, a JSON override): key=value forms and
# the well-known token shapes of Hugging Face and OpenAI-style keys.
# A key may carry a prefix (`aws_secret_access_key`, `client_secret`, `hf_token`) but must end
# in the secret word (and `_key`/`_value`): `max_tokens=8` is not a secret.
_INLINE_PATTERN = (
    r"""(?ix)
    (?P<key>(?<![\w-])(?:[\w-]*[_-])?
        (?:api[_-]?key|access[_-]?key|token|secret|password|passwd|credentials?|authorization)
        (?:[_-](?:key|value))?
        ["']?\s*[:=]\s*["']?(?:bearer\s+)?)
    (?P<val>[^\s"',}]+)
    | (?P<tok>\b(?:hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_-]{8,})\b)
    | (?P<url>\b[a-z][a-z0-9+.-]*://)(?P<userinfo>[^/\s@"',]+)@
    """
)
# Every match of it holds one of these, as ASCII text lower-cased reads it (the key words,
# the token prefixes, a URL's scheme end): ASCII text without any has nothing to mask. The
# pattern is compiled at its first use (~1.2 ms: a `check` whose line has none of these
# never pays it); other text always goes through it.
_INLINE_WORDS = ("key", "token", "secret", "passw", "credential", "authorization", "hf_",
                 "sk-", "://")
_VALUE_KEYS = ("value", "old_value", "new_value")  # journal fields holding a flag's value


def is_secret_dest(dest: str) -> bool:
    """True for options whose value must never be logged."""
    return bool(_SECRET_DEST.search(dest))


def is_secret_flag(flag: str) -> bool:
    """True for a flag (`--api-key`) or a YAML key (`api-key`) whose option is a secret."""
    return is_secret_dest(flag.lstrip("-").replace("-", "_"))


@functools.cache
def _inline() -> re.Pattern[str]:
    return re.compile(_INLINE_PATTERN)


def redact_text(text: str) -> str:
    """Mask key=value secrets and token-shaped words in free text."""
    if text.isascii():
        low = text.lower()
        if not any(word in low for word in _INLINE_WORDS):
            return text

    def _sub(m: re.Match[str]) -> str:
        if m.group("url"):
            return f"{m.group('url')}{MASK}@"  # URL userinfo: user and password both go
        return MASK if m.group("tok") else m.group("key") + MASK

    return _inline().sub(_sub, text)


def redact_argv(argv: Sequence[str], table: OptionTable) -> list[str]:
    """A copy of `argv` with the values of secret options masked (any spelling SGLang accepts)."""
    out = list(argv)
    i = 0
    while i < len(out):
        if out[i] == "--":  # argparse: no options after it (and `--` prefixes every option)
            out[i + 1:] = [redact_text(tok) for tok in out[i + 1:]]
            break
        look = table.lookup(out[i])
        if look.kind == "ambiguous" and any(is_secret_dest(table.by_string[m].dest)
                                            for m in look.matches):
            # SGLang rejects an ambiguous prefix, but the value typed after it is still a secret.
            if "=" in out[i]:
                out[i] = f"{out[i].split('=', 1)[0]}={MASK}"
            elif i + 1 < len(out):
                out[i + 1] = MASK
                i += 1
        elif look.spec is not None and is_secret_dest(look.spec.dest):
            if look.explicit is not None:
                out[i] = f"{out[i].split('=', 1)[0]}={MASK}"
            elif look.spec.takes_value and i + 1 < len(out):
                out[i + 1] = MASK
                i += 1
        else:
            out[i] = redact_text(out[i])
        i += 1
    return out


def redact_value(value: Any) -> Any:
    """`value` with every string in it (nested lists and mappings too) through redact_text."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return value


def redact_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A journal/log record safe to store: free text masked, a secret flag's values hidden.

    `flag` names the option a record is about (`--api-key`, as a rule or preflight wrote it);
    when its dest is a secret, `value`, `old_value` and `new_value` are masked whole.
    """
    flag = record.get("flag")
    secret = isinstance(flag, str) and is_secret_flag(flag)
    out: dict[str, Any] = {}
    for key, value in record.items():
        if secret and key in _VALUE_KEYS and value is not None:
            out[key] = MASK
        else:
            out[key] = redact_value(value)
    return out


def redact_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang YAML config data safe to show: a secret option's value (`api-key: ...`) masked
    whole, every other string through redact_text."""
    return {key: MASK if isinstance(key, str) and is_secret_flag(key) and value is not None
            else redact_value(value) for key, value in data.items()}
