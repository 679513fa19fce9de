"""The probe's NVML calls through ctypes (nvmlctypes.py) answer as pynvml does.

No NVIDIA driver is needed: a fake NVML library made of real C callbacks (ctypes CFUNCTYPE:
the arguments go through ctypes' marshalling as they would to libnvidia-ml) stands in for
libnvidia-ml.so.1, and pynvml's own functions run against it too (its `nvmlLib` pointed at
the fake). For hosts of one GPU, of mixed GPUs, none, and each call failing with each of
NVML's error codes, the whole probe (`probe_gpu()`: ctypes first, pynvml for a failure's
words) gives what the probe over pynvml gives, and both call the same C functions.
Where the real NVML exists, the two are compared on it as well.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import pytest

from sglang_guard.preflight.shell import gpuprobe, nvmlctypes

pynvml = pytest.importorskip("pynvml")

INT, U, P = ctypes.c_int, ctypes.c_uint, ctypes.POINTER
FUNCTIONS = {  # name -> the C signature (return type first)
    "nvmlInitWithFlags": (INT, U),
    "nvmlShutdown": (INT,),
    "nvmlDeviceGetCount_v2": (INT, P(U)),
    "nvmlDeviceGetHandleByIndex_v2": (INT, U, ctypes.c_void_p),  # any pointer's address
    "nvmlDeviceGetCudaComputeCapability": (INT, ctypes.c_void_p, P(INT), P(INT)),
    "nvmlDeviceGetName": (INT, ctypes.c_void_p, P(ctypes.c_char), U),
}
BASE = 0x1000  # handle of device i: BASE + i


class FakeNvml:
    """A C-callable NVML: `gpus` as (major, minor, name); `fail` maps a function to a code."""

    def __init__(self, gpus: list[tuple[int, int, bytes]], fail: dict[str, int]) -> None:
        self.gpus, self.fail, self.called = gpus, fail, set[str]()
        impl = {"nvmlInitWithFlags": lambda flags: 0, "nvmlShutdown": lambda: 0,
                "nvmlDeviceGetCount_v2": self._count, "nvmlDeviceGetHandleByIndex_v2": self._handle,
                "nvmlDeviceGetCudaComputeCapability": self._cc,
                "nvmlDeviceGetName": self._name}
        self._fns = {name: ctypes.CFUNCTYPE(*sig)(self._wrap(name, impl[name]))
                     for name, sig in FUNCTIONS.items()}

    def _wrap(self, name: str, fn: Any) -> Any:
        def call(*args: Any) -> int:
            return self.fail.get(name) or int(fn(*args))
        return call

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._fns:
            raise AttributeError(name)
        self.called.add(name)
        return self._fns[name]

    def _count(self, out: Any) -> int:
        out[0] = len(self.gpus)
        return 0

    def _handle(self, index: int, out: Any) -> int:
        if index >= len(self.gpus):
            return 2  # NVML_ERROR_INVALID_ARGUMENT
        ctypes.c_void_p.from_address(out).value = BASE + index
        return 0

    def _cc(self, handle: int, major: Any, minor: Any) -> int:
        major[0], minor[0] = self.gpus[handle - BASE][:2]
        return 0

    def _name(self, handle: int, buf: Any, size: int) -> int:
        name = self.gpus[handle - BASE][2]
        if len(name) + 1 > size:
            return 7  # NVML_ERROR_INSUFFICIENT_SIZE
        ctypes.memmove(buf, name + b"\0", len(name) + 1)
        return 0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Make a fake NVML the library both ways load."""
    made: list[FakeNvml] = []

    def make(gpus: list[tuple[int, int, bytes]], fail: dict[str, int] | None = None) -> FakeNvml:
        lib = FakeNvml(gpus, fail or {})
        made.append(lib)
        monkeypatch.setattr(pynvml, "nvmlLib", lib)
        pynvml._nvmlGetFunctionPointer_cache.clear()
        monkeypatch.setattr(nvmlctypes, "load", lambda: lib)
        monkeypatch.setattr(gpuprobe, "_no_nvml_library", lambda: None)
        return lib

    yield make
    pynvml._nvmlGetFunctionPointer_cache.clear()


H200 = (9, 0, b"NVIDIA H200")
HOSTS = {"one": [H200], "eight": [H200] * 8, "mixed": [(8, 0, b"NVIDIA A100-SXM4-80GB"), H200],
         "none": [], "long name": [(12, 0, b"N" * 95)], "too long": [(12, 0, b"N" * 96)],
         "not utf-8": [(10, 0, b"GPU \xff")]}
CODES = (1, 2, 3, 4, 6, 7, 9, 12, 13, 15, 999)  # NVML's error codes, and one it does not name


@pytest.mark.parametrize("host", HOSTS)
def test_a_host_is_seen_alike_both_ways(host: str, fake: Any) -> None:
    lib = fake(HOSTS[host])
    by_pynvml = gpuprobe.probe_gpu(pynvml)
    ctypes_lib = fake(HOSTS[host])
    by_ctypes = gpuprobe._probe_ctypes()  # None: a call failed, pynvml is asked
    assert ctypes_lib.called == lib.called  # the same C functions, no other
    assert (by_ctypes is None) is (host in ("too long", "not utf-8"))
    assert by_ctypes in (None, by_pynvml)
    fake(HOSTS[host])
    assert gpuprobe.probe_gpu() == by_pynvml
    if host == "one":
        assert by_pynvml.sm == 90 and by_pynvml.name == "NVIDIA H200"
    if host == "mixed":
        assert by_pynvml.sm == 80 and by_pynvml.notes


@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("function", [f for f in FUNCTIONS if f != "nvmlShutdown"])
def test_a_failing_call_is_worded_by_pynvml(function: str, code: int, fake: Any) -> None:
    fake([H200, (8, 0, b"A100")], {function: code})
    want = gpuprobe.probe_gpu(pynvml)
    assert want.source == "unknown" and want.warning
    assert gpuprobe.probe_gpu() == want  # the ctypes attempt failed; pynvml said why
    with pytest.raises(nvmlctypes.NvmlFailed) as failed:
        gpuprobe._ask(nvmlctypes.Nvml(fake([H200], {function: code})), strict=True)
    assert failed.value.code == code


def test_a_missing_function_is_pynvmls_function_not_found(fake: Any) -> None:
    lib = fake([H200])
    del lib._fns["nvmlInitWithFlags"]
    assert gpuprobe.probe_gpu() == gpuprobe.probe_gpu(pynvml)
    with pytest.raises(nvmlctypes.NvmlFailed) as failed:
        nvmlctypes.Nvml(lib).nvmlInit()
    assert failed.value.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND


def test_the_layouts_are_pynvmls() -> None:
    assert nvmlctypes.NAME_BUFFER == pynvml.NVML_DEVICE_NAME_V2_BUFFER_SIZE
    assert ctypes.sizeof(ctypes.c_void_p) == ctypes.sizeof(pynvml.c_nvmlDevice_t)
    assert (ctypes.sizeof(U), ctypes.sizeof(INT)) == (4, 4)  # unsigned int, int: as NVML's C


def test_the_library_is_the_one_pynvml_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []

    def cdll(name: str, *args: Any, **kwargs: Any) -> Any:
        loaded.append(name)
        raise OSError(name)

    monkeypatch.setattr(pynvml, "CDLL", cdll)
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlInit()
    with pytest.raises(OSError, match="libnvidia-ml"):
        nvmlctypes.load()
    assert loaded == [nvmlctypes.LIBRARY] * 2


def test_on_real_nvml_both_ways_agree() -> None:
    try:
        lib = nvmlctypes.load()
    except OSError:
        assert gpuprobe._no_nvml_library() is not None  # this host has no NVIDIA driver
        assert gpuprobe.probe_gpu() == gpuprobe.probe_gpu(pynvml)
        pytest.skip("no libnvidia-ml.so.1 here: compared on the fake library above")
    assert gpuprobe._ask(nvmlctypes.Nvml(lib), strict=False) == gpuprobe.probe_gpu(pynvml)
    assert gpuprobe.probe_gpu() == gpuprobe.probe_gpu(pynvml)
