"""The part of SGLang's arg_utils.py the static reader models (fields -> add_argument)."""

import dataclasses
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

A = Annotated


@dataclasses.dataclass(frozen=True)
class Arg:
    help: str = ""
    choices: Any = None
    aliases: Any = None
    cli_name: Any = None
    type_parser: Any = None
    nargs: Any = None
    action: Any = None
    action_kwargs: Any = None
    no_cli: bool = False


def _infer(tp):
    """SGLang's _infer_type_func: int and float checked, anything else a string."""
    return tp if tp in (int, float) else str


def add_cli_args_from_dataclass(parser, cls):
    hints = get_type_hints(cls, include_extras=True)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if get_origin(hint) is not Annotated:
            continue
        raw, *meta = get_args(hint)
        arg = next((m if isinstance(m, Arg) else Arg(help=m) for m in meta
                    if isinstance(m, (Arg, str))), None)
        if arg is None or arg.no_cli:
            continue
        cli = arg.cli_name or "--" + field.name.replace("_", "-")
        names = [cli] + (arg.aliases or [])
        dest = {"dest": field.name} if cli.lstrip("-").replace("-", "_") != field.name else {}
        if field.default is not dataclasses.MISSING:  # as SGLang's _field_default passes it
            dest["default"] = field.default
        if arg.action is not None:
            parser.add_argument(*names, action=arg.action, **dest, **(arg.action_kwargs or {}))
            continue
        inner = raw
        if get_origin(raw) is Union:
            rest = [a for a in get_args(raw) if a is not type(None)]
            inner = rest[0] if len(rest) == 1 else raw
        if get_origin(inner) is Literal:
            values = list(get_args(inner))
            parser.add_argument(*names, choices=arg.choices or values,
                                type=arg.type_parser or _infer(type(values[0])), **dest)
        elif get_origin(inner) in (list, typing.List) and arg.type_parser is None:
            parser.add_argument(*names, nargs=arg.nargs or "+", **dest)
        elif inner is bool:
            parser.add_argument(*names, action="store_true", **dest)
        else:
            kw = {"nargs": arg.nargs} if arg.nargs else {}
            parser.add_argument(*names, choices=arg.choices or None, **kw, **dest,
                                type=arg.type_parser or _infer(inner))
