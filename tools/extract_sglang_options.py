"""Dump SGLang's own argparse table to JSON (run with the test-bed's Python, where SGLang is).

    <sglang-venv>/bin/python tools/extract_sglang_options.py > configs/sglang/options-0.5.23.json

The guard reads SGLang command lines with this table instead of importing SGLang (which takes
seconds and a GPU stack). The conformance tests re-run this against the installed SGLang and
fail when the shipped table has drifted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _yaml_kind(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "store_true"
    if isinstance(action, argparse._StoreAction) or action.nargs is None:
        return "value"
    return "unsupported"


def _type_name(action: argparse.Action) -> str | None:
    if action.nargs == 0:
        return None
    return action.type.__name__ if action.type in (int, float) else None


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def dump() -> dict[str, Any]:
    """SGLang's parser as data: one entry per option-bearing action."""
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        nargs = action.nargs
        options.append(
            {
                "strings": list(action.option_strings),
                "dest": action.dest,
                "action": type(action).__name__,
                "nargs": nargs if isinstance(nargs, (int, str)) or nargs is None else str(nargs),
                "choices": (
                    [str(c) for c in action.choices] if action.choices is not None else None
                ),
                "store_true": isinstance(action, argparse._StoreTrueAction),
                # How SGLang's --config YAML merger treats it (server_args_config_parser.py):
                # store_true keys become a bare flag, one-value keys `--key value`, others fail.
                "yaml": _yaml_kind(action),
                # argparse's type check the guard repeats ("invalid int value: 'x'").
                "type": _type_name(action),
                # The release's default where it is a JSON scalar (what absent flags read).
                **({"default": action.default} if _is_scalar(action.default) else {}),
            }
        )
    return {
        "sglang_version": sglang.__version__,
        "python": sys.version.split()[0],
        "allow_abbrev": parser.allow_abbrev,
        "options": options,
    }


if __name__ == "__main__":
    json.dump(dump(), sys.stdout, indent=1)
    sys.stdout.write("\n")
