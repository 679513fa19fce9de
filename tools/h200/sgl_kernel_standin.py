"""An import-time stand-in for `sgl_kernel` (and its submodules) for SGLang's argument phase.

On CUDA, `srt/layers/quantization` imports `sgl_kernel` at module import; the argument phase
never calls it. Any attribute resolves to a harmless placeholder. Install with `install()`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

NAMES = ("sgl_kernel", "sglang_kernel")


class _Placeholder:
    """Callable, subscriptable, attribute-rich nothing."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self._name}.{item}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Placeholder(f"{self._name}()")

    def __getitem__(self, item: Any) -> Any:
        return _Placeholder(f"{self._name}[]")

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._name}>"


class _Module(types.ModuleType):
    __version__: str

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self.__name__}.{item}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".", maxsplit=1)[0] in NAMES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        mod = _Module(spec.name)
        mod.__path__ = []
        mod.__version__ = "0.4.10"
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Put the stand-in first on sys.meta_path."""
    sys.meta_path.insert(0, _Finder())
