"""Hide secrets (API keys, tokens) in everything the guard logs or prints."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sglang_guard.core.options import OptionTable

MASK = "***"
# dest names whose values are secrets: --api-key, --admin-api-key, hub tokens, passwords...
# and --watermark-config, which carries the watermark key (SGLang 0.5.23 redacts it itself:
# sglang/srt/sampling/watermarking/core.py:110-134).
_SECRET_DEST = re.compile(
    r"(api_key$|password|passwd|secret|credential|^(hf_|auth_|access_)?token$|^watermark_config$)"
)
# Secrets that show up inside free text (a log line, a JSON override): key=value forms and
# the well-known token shapes of Hugging Face and OpenAI-style keys.
_INLINE = re.compile(
    r"""(?ix)
    (?P<key>(?:api[_-]?key|token|secret|password|authorization)["']?\s*[:=]\s*["']?(?:bearer\s+)?)
    (?P<val>[^\s"',}]+)
    | (?P<tok>\b(?:hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_-]{8,})\b)
    """
)


def is_secret_dest(dest: str) -> bool:
    """True for options whose value must never be logged."""
    return bool(_SECRET_DEST.search(dest))


def redact_text(text: str) -> str:
    """Mask key=value secrets and token-shaped words in free text."""
    def _sub(m: re.Match[str]) -> str:
        return MASK if m.group("tok") else m.group("key") + MASK

    return _INLINE.sub(_sub, text)


def redact_argv(argv: Sequence[str], table: OptionTable) -> list[str]:
    """A copy of `argv` with the values of secret options masked (any spelling SGLang accepts)."""
    out = list(argv)
    i = 0
    while i < len(out):
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
