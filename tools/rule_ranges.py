#!/usr/bin/env python3
"""Which SGLang releases print each rule's messages (read from the wheels), as `when.sglang`.

    tools/rule_ranges.py            # print each rule's range
    tools/rule_ranges.py --write    # write `sglang = "..."` into configs/rules/default.toml

A rule acts only on a release whose own source holds the message it is written for: SGLang
rewords its checks, and a rule matched against a release that never prints its message is no
rule of that release. The messages are those of tests/data/sglang-messages-0.5.23.toml (each
names the rule that must catch it; the exception class in front is Python's, not the
source's; a message printed with numbers in it carries its f-string as `template`, which is
what is searched). A rule with no SGLang message there, or one no release's source holds (torch's
OOM text, uvicorn's bind error, argparse's own wording), or whose `when.sglang` is written by
hand, is left as it is. Same wheels and the
same search as tools/constraint_ranges.py.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from constraint_ranges import release_texts, spec_for

from sglang_guard.sglang.msgsearch import holds, parts

REPO = Path(__file__).resolve().parent.parent
PACK = REPO / "configs" / "rules" / "default.toml"
MESSAGES = REPO / "tests" / "data" / "sglang-messages-0.5.23.toml"
# Older wordings of the same checks (each names its rule too).
OTHER_MESSAGES = REPO / "tests" / "data" / "sglang-messages-other-releases.toml"
MARK = "# range: tools/rule_ranges.py"  # what the tool wrote (and the test recomputes)
_CLASS = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Warning): ")


def open_below(spec: str, oldest: str) -> str:
    """A run that reaches the oldest release read says nothing about older ones: no lower
    bound then (`>=0` for every release), so a rule is not switched off where it was not read."""
    parts_ = [p for p in spec.split(",") if p != f">={oldest}"]
    return ",".join(parts_) or ">=0"


def messages_by_rule() -> dict[str, list[str]]:
    """rule id -> the SGLang messages (exception class stripped) it is written for."""
    found: list[dict[str, object]] = []
    for path in (MESSAGES, OTHER_MESSAGES):
        if path.is_file():
            found += tomllib.loads(path.read_text(encoding="utf-8")).get("message", [])
    out: dict[str, list[str]] = {}
    for m in found:
        # A message rendered with numbers is looked for as its source template when it has one.
        text = _CLASS.sub("", str(m.get("template", m["text"])))
        if parts(text):
            out.setdefault(str(m["rule"]), []).append(text)
    return out


def write(text: str, specs: dict[str, str]) -> str:
    """`text` with `sglang = "..."` in each named rule's [rules.when] (created if missing)."""
    out: list[str] = []
    for block in re.split(r"(?m)^(?=\[\[rules\]\]\s*$)", text):
        m = re.search(r'(?m)^id = "([^"]+)"', block)
        if not block.startswith("[[rules]]") or not m or m.group(1) not in specs:
            out.append(block)
            continue
        line = f'sglang = "{specs[m.group(1)]}"  {MARK}\n'
        lines = block.splitlines(keepends=True)
        when = next((i for i, x in enumerate(lines) if x.strip() == "[rules.when]"), None)
        if when is not None:
            lines.insert(when + 1, line)
        else:  # after the rule's last key (single-line values only in this pack)
            last = max(i for i, x in enumerate(lines) if re.match(r"^[a-z_]+ = ", x))
            lines[last + 1:last + 1] = ["[rules.when]\n", line]
        out.append("".join(lines))
    return "".join(out)


def main() -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update configs/rules/default.toml")
    args = ap.parse_args()
    loaded = release_texts()
    if loaded is None:
        return 2
    versions, texts = loaded
    pack = tomllib.loads(PACK.read_text(encoding="utf-8"))
    by_rule = messages_by_rule()
    specs: dict[str, str] = {}
    for rule in pack["rules"]:
        rid = rule["id"]
        if rid not in by_rule or "sglang" in rule.get("when", {}):
            continue
        present = [any(holds(t, msg) for msg in by_rule[rid]) for t in texts]
        if not any(present):  # not SGLang's own text (torch's, argparse's): every release
            print(f"{rid}: no release's source holds its message; left as it is")
            continue
        specs[rid] = open_below(spec_for(present, versions, versions[-1]), versions[0])
        print(f"{rid}: {specs[rid]}")
    if args.write:
        PACK.write_text(write(PACK.read_text(encoding="utf-8"), specs), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
