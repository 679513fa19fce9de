import argparse
import dataclasses
from typing import List, Literal, Optional

from sglang.srt.arg_utils import A, Arg, add_cli_args_from_dataclass
from sglang.srt.choices import EXTRA, MAP, SAMPLING, Mode


class DeprecatedAction(argparse.Action):
    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        raise ValueError(self.help)


class ListAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(values))


class Base:
    pass


@dataclasses.dataclass
class ServerArgs:
    model_path: A[str, Arg(help="The model.", aliases=["--model"])]
    tp_size: A[int, Arg(help="TP.", cli_name="--tensor-parallel-size", aliases=["--tp-size"])] = 1
    mode: A[Optional[Literal["x", "y"]], "A mode."] = None
    paths: A[Optional[List[str]], "Paths."] = None
    flag: A[bool, "A flag."] = False
    hidden: A[int, Arg(help="no", no_cli=True)] = 0
    both: A[bool, Arg(help="b", action=argparse.BooleanOptionalAction)] = True
    parsed: A[Optional[str], Arg(help="json", type_parser=str, choices=["p", "q"])] = None
    plain: int = 3

    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        group = parser.add_argument_group("group")
        group.add_argument("--attention-backend", choices=EXTRA, help=f"One of {EXTRA}.")
        parser.add_argument("--kv", choices=[m.name.lower() for m in Mode])
        parser.add_argument("--keys", choices=list(MAP.keys()), nargs="*")
        parser.add_argument("--sampling", choices=SAMPLING)
        parser.add_argument("--old-tp", action=DeprecatedAction,
                            help="Deprecated alias for --tp-size.")
        parser.add_argument("--lora", action=ListAction, nargs="*")
        parser.add_argument("--const", action="store_const", const=1)
        parser.add_argument("--many", action="append")
        parser.add_argument("-q", "--quiet", action="store_false", dest="loud")
        for name in ("alpha", "beta"):
            parser.add_argument(f"--{name}-size", type=int, default=ServerArgs.tp_size)
        _more_args(parser)


def _more_args(parser):
    parser.add_argument("--count", action="count")
