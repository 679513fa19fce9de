"""Dump an unpacked SGLang release's own argparse with every third-party import stubbed.

    python -S tools/stubbed_argparse_dump.py UNPACKED_WHEEL_DIR [EXTRA_SITE_DIR]

A cross-check for releases that cannot be imported without torch: the stubs are falsy,
iterate as empty and accept any call, so module-level probes take their "no GPU stack"
path. It works for the releases whose argument code needs nothing real from those imports
(0.5.1-0.5.1.post3 today); later releases compute from torch at import time and fail here.
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import sys
import types
from collections.abc import Iterator, Sequence

STDLIB = set(sys.stdlib_module_names)
# Pure, importable libraries SGLang's argument code itself needs; everything else is a stub.
ABSENT = ("npu", "habana", "hpu", "xpu", "mlx", "musa", "hip", "ascend", "mindspore")
REAL = {"sglang", "msgspec", "packaging", "typing_extensions"}


class Stub(types.ModuleType):
    """A module/object that is anything: attribute, call, iteration, subclassing."""
    __version__ = "2.9.0"

    def __getattr__(self, name: str) -> type[_AnyBase]:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any(f"{self.__name__}.{name}")


class _AnyMeta(type):
    def __getattr__(cls, name: str) -> type[_AnyBase]:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any(name)

    def __iter__(cls) -> Iterator[object]:
        return iter(())

    def __or__(cls, other: object) -> _AnyMeta:
        return cls

    __ror__ = __or__

    def __getitem__(cls, item: object) -> _AnyMeta:
        return cls


class _AnyBase(metaclass=_AnyMeta):
    def __init_subclass__(cls, **kwargs: object) -> None:
        pass

    def __init__(self, *a: object, **k: object) -> None:
        pass

    def __call__(self, *a: object, **k: object) -> _AnyBase:
        return _AnyBase()

    def __getattr__(self, name: str) -> _AnyBase:
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyBase()

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Iterator[object]:
        return iter(())


def _Any(name: str) -> type[_AnyBase]:
    return type(name.rsplit(".", maxsplit=1)[-1], (_AnyBase,), {})


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        root = name.split(".", maxsplit=1)[0]
        if root in STDLIB or root in REAL or any(k in root for k in ABSENT):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Stub:
        m = Stub(spec.name)
        m.__path__ = []  # a package: submodules resolve through this finder too
        return m

    def exec_module(self, module: types.ModuleType) -> None:
        pass


sys.path.insert(0, sys.argv[1])
sys.path.extend(sys.argv[2:])
sys.meta_path.insert(0, Finder())
from sglang.srt.server_args import ServerArgs  # noqa: E402

parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
opts = []
for action in parser._actions:
    if not action.option_strings or isinstance(action, argparse._HelpAction):
        continue
    nargs = action.nargs
    opts.append({
        "strings": list(action.option_strings), "dest": action.dest,
        "action": type(action).__name__,
        "nargs": nargs if isinstance(nargs, (int, str)) or nargs is None else str(nargs),
        "choices": [str(c) for c in action.choices] if action.choices is not None else None,
        "store_true": isinstance(action, argparse._StoreTrueAction),
        "yaml": "store_true" if isinstance(action, argparse._StoreTrueAction) else (
            "value" if isinstance(action, argparse._StoreAction) or action.nargs is None
            else "unsupported"),
        "type": action.type.__name__ if action.nargs != 0 and action.type in (int, float)
        else None,
        **({"default": action.default} if action.default is None
           or isinstance(action.default, (bool, int, float, str)) else {}),
    })
json.dump({"options": opts}, sys.stdout)
