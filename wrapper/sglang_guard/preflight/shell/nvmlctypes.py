"""The few NVML calls the GPU probe makes, through ctypes, without importing pynvml.

pynvml (nvidia-ml-py) is one 330 KB module: its import is ~20 ms of a cached `check` on a
GPU host (issue 24). The probe needs six calls; `Nvml` makes the very calls pynvml's
functions of the same names make (the same C functions, argument types and name buffer:
tests/unit/test_nvmlctypes.py runs pynvml's own functions and these against one fake NVML
library and holds them equal), and raises `NvmlFailed` with NVML's return code where pynvml
raises its NVMLError. The probe answers from here only when every call succeeded; any
failure is asked again through pynvml itself, whose error words the probe reports.
"""

from __future__ import annotations

import ctypes
from typing import Any

LIBRARY = "libnvidia-ml.so.1"  # what pynvml loads on Linux
NAME_BUFFER = 96  # pynvml's NVML_DEVICE_NAME_V2_BUFFER_SIZE


class NvmlFailed(Exception):
    """An NVML call returned `code` (not NVML_SUCCESS)."""

    def __init__(self, function: str, code: int) -> None:
        super().__init__(f"{function} returned {code}")
        self.code = code


def load() -> Any:
    """NVML's library (OSError where it cannot be loaded, as for pynvml's CDLL)."""
    return ctypes.CDLL(LIBRARY)


class Nvml:
    """pynvml's nvmlInit ... nvmlShutdown over a loaded library (`lib`: any object with the
    C functions as attributes, as a ctypes.CDLL has)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib

    def _call(self, function: str, *args: Any) -> None:
        try:
            fn = getattr(self._lib, function)
        except AttributeError:  # pynvml: NVML_ERROR_FUNCTION_NOT_FOUND
            raise NvmlFailed(function, 13) from None
        code = fn(*args)
        if code != 0:
            raise NvmlFailed(function, int(code))

    def nvmlInit(self) -> None:  # pynvml's names: the probe takes either
        self._call("nvmlInitWithFlags", 0)  # pynvml's nvmlInit is nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        count = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        return count.value

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()  # nvmlDevice_t: an opaque pointer
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        return handle

    def nvmlDeviceGetCudaComputeCapability(self, handle: ctypes.c_void_p) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("nvmlDeviceGetCudaComputeCapability", handle, ctypes.byref(major),
                   ctypes.byref(minor))
        return major.value, minor.value

    def nvmlDeviceGetName(self, handle: ctypes.c_void_p) -> str:
        name = ctypes.create_string_buffer(NAME_BUFFER)
        self._call("nvmlDeviceGetName", handle, name, ctypes.c_uint(NAME_BUFFER))
        return name.value.decode()  # pynvml decodes it the same way (convertStrBytes)
