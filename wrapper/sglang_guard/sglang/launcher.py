"""A whole pasted command line read for its SGLang arguments: `check -- python -m
sglang.launch_server --model-path M …` means what `check -- --model-path M …` means.

Pure: tokens in, tokens out. Recognised (each after any leading `NAME=value` environment
words, as a shell line or a unit file's ExecStart= may start):
- `<python> -m sglang.launch_server ARGS…` (any python, python3, python3.11, or a path to one),
  and the guard's drop-in for it: `<python> -m sglang_guard.launch_server ARGS…`,
  `sglang-guard-launch ARGS…` -> the launch_server arguments;
- `sglang serve ARGS…` (the `sglang` script, or a path to it) and `sglang-guard serve ARGS…`
  -> `sglang serve`'s arguments, which serve.split_args then reads as SGLang does.
Anything else is taken as the arguments themselves, as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

_PYTHON = re.compile(r"python(?:\d+(?:\.\d+)*)?")
_ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_MODULES = ("sglang.launch_server", "sglang_guard.launch_server")


@dataclass(frozen=True, slots=True)
class Launch:
    """What a command line runs: `form` "launch_server" or "serve" (a launcher was named),
    or "args" (none was: the words are SGLang's arguments); `args` the words after it."""

    form: Literal["launch_server", "serve", "args"]
    args: tuple[str, ...]


def _name(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def read_launch(words: Sequence[str]) -> Launch:
    """The launcher `words` start with, if any, and the arguments after it."""
    start = 0
    while start < len(words) and _ENV_WORD.match(words[start]):
        start += 1
    head = [*words[start:start + 3]]
    rest = tuple(words[start:])
    if head and _PYTHON.fullmatch(_name(head[0])) and head[1:3] in (["-m", m] for m in _MODULES):
        return Launch("launch_server", rest[3:])
    if head and _name(head[0]) == "sglang-guard-launch":
        return Launch("launch_server", rest[1:])
    if len(head) >= 2 and _name(head[0]) in ("sglang", "sglang-guard") and head[1] == "serve":
        return Launch("serve", rest[2:])
    return Launch("args", tuple(words))
