"""The test rule pack, once: the machine's unit histories and the real guards both match it.

Each line below is one its rules catch (as SGLang would print it, or close to it).
"""

from __future__ import annotations

from pathlib import Path

from sglang_guard.rules.rulepack import RulePack, parse_pack

FA3_LINE = "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90."
CRASH_LINE = ("[2026-11-29 16:50:00 TP0] Scheduler hit an exception: "
              "Traceback (most recent call last):")
DRAFT_LINE = "ValueError: draft backend needs MLA"
GIVE_UP_LINE = "ERROR: [Errno 98] error while attempting to bind: address already in use"

PACK_TEXT = """
[pack]
name = "test"
sglang_versions = ">=0.5.23"

[[rules]]
id = "fa3-sm"
pattern = 'FlashAttention v3 Backend requires SM>=80'
action = "drop_flag"
flags = ["--attention-backend"]
values = ["fa3"]
reason = "fa3 needs SM80-90"
phase = "any"

[[rules]]
id = "draft-triton"
pattern = 'draft backend needs MLA'
action = "set_flag"
flags = ["--speculative-draft-attention-backend"]
new_value = "triton"
phase = "any"

[[rules]]
id = "two-flags"
pattern = 'backend pair is bad'
action = "drop_flag"
flags = ["--decode-attention-backend", "--attention-backend"]
max_fires = 2

[[rules]]
id = "port-busy"
pattern = 'address already in use'
action = "give_up"
reason = "the port is taken"

[[rules]]
id = "crash"
pattern = 'Scheduler hit an exception: '
action = "restart"
max_fires = 9
priority = -10
reason = "scheduler crashed"
phase = "any"  # as the default pack's scheduler-crash: a crash after ready restarts too

[[rules]]
id = "just-a-warning"
pattern = 'harmless warning'
action = "restart"
fatal = false
"""


def parsed_pack() -> RulePack:
    """The pack, parsed (as from a file named test.toml)."""
    return parse_pack(PACK_TEXT, "test.toml")


def write_pack(directory: Path) -> Path:
    """The pack as a file a guard config names."""
    path = directory / "rules.toml"
    path.write_text(PACK_TEXT)
    return path
