"""The GPU's compute capability, from NVML (as SGLang itself reads it) or from `--gpu-sm`."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from sglang_guard.errors import InputError
from sglang_guard.preflight.facts import GpuFacts


def parse_gpu_sm(value: str) -> GpuFacts | None:
    """`--gpu-sm`: None for `auto` (probe), no GPU for `none`, else an SM like 90 or 9.0."""
    text = value.strip().lower()
    if text == "auto":
        return None
    if text == "none":
        return GpuFacts(sm=None, source="none")
    try:
        sm = round(float(text) * 10) if "." in text else int(text.removeprefix("sm"))
    except ValueError:
        raise InputError(
            f"--gpu-sm {value!r}: expected auto, none, or an SM number such as 90, 100, 120"
        ) from None
    if not 10 <= sm <= 200:
        raise InputError(f"--gpu-sm {value!r}: {sm} is not a compute capability (e.g. 80, 90, 100)")
    return GpuFacts(sm=sm, source="override")


def probe_gpu(nvml: Any = None) -> GpuFacts:
    """Ask NVML for the first visible GPU; an unknown GPU (with a warning) when it cannot tell.

    `nvml`: pynvml or an object with its functions; None: NVML through ctypes where every
    call succeeds (nvmlctypes.py: no pynvml import), else through pynvml, whose words for
    the failure the warning quotes.
    """
    if nvml is None:
        if (missing := _no_nvml_library()) is not None:
            return missing
        if (found := _probe_ctypes()) is not None:
            return found
        try:
            import pynvml  # noqa: PLC0415 - nvidia-ml-py, only needed for `auto`

            nvml = pynvml
        except ImportError:
            return GpuFacts(sm=None, source="unknown",
                            warning="nvidia-ml-py is not installed: GPU checks skipped")
    return _ask(nvml, strict=False)


def _probe_ctypes() -> GpuFacts | None:
    """The answer through ctypes when every NVML call succeeds (None: ask pynvml)."""
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("pynvml") is None:
        return None  # not installed: said as before, by the caller
    from sglang_guard.preflight.shell import nvmlctypes  # noqa: PLC0415

    try:
        return _ask(nvmlctypes.Nvml(nvmlctypes.load()), strict=True)
    except Exception:  # any failure: pynvml is asked again and words it
        return None


def _ask(nvml: Any, *, strict: bool) -> GpuFacts:
    """The probe's questions to `nvml`; `strict`: a failure raises instead of warning."""
    try:
        nvml.nvmlInit()
    except Exception as exc:  # any NVML failure means "cannot tell"
        if strict:
            raise
        return GpuFacts(sm=None, source="unknown",
                        warning=f"no NVIDIA driver found (NVML: {_nvml_text(exc)}): "
                                "GPU checks skipped")
    try:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            return GpuFacts(sm=None, source="unknown",
                            warning="NVML sees no GPU: GPU checks skipped")
        index = _first_visible(count)
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        name = nvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        sms = {nvml.nvmlDeviceGetCudaComputeCapability(nvml.nvmlDeviceGetHandleByIndex(i))
               for i in range(count)}
        notes = ("GPUs of more than one compute capability on this host; checked against the "
                 f"first visible one (index {index})",) if len(sms) > 1 else ()
        return GpuFacts(sm=int(major) * 10 + int(minor), name=name, source="nvml", notes=notes)
    except Exception as exc:  # NVML raises its own NVMLError family, and more
        if strict:
            raise
        return GpuFacts(sm=None, source="unknown",
                        warning=f"NVML query failed ({_nvml_text(exc)}): GPU checks skipped")
    finally:
        with contextlib.suppress(Exception):  # shutting down a half-initialised NVML
            nvml.nvmlShutdown()


def _no_nvml_library() -> GpuFacts | None:
    """What probing says when NVML's library cannot be loaded, found before importing pynvml.

    pynvml's import costs a cached `check` ~20 ms, and on a host without the NVIDIA driver
    its nvmlInit fails anyway: on Linux it dlopens `libnvidia-ml.so.1`, and so does this, first
    (with _ctypes' dlopen, as ctypes.CDLL does, without ctypes' own import).
    The answer is the one the failed nvmlInit gives (None: go on and ask NVML).
    """
    import importlib.util  # noqa: PLC0415
    import sys  # noqa: PLC0415

    if not sys.platform.startswith("linux") or importlib.util.find_spec("pynvml") is None:
        return None  # elsewhere pynvml looks in other places; not installed: said below
    import _ctypes  # noqa: PLC0415

    try:
        handle = _ctypes.dlopen("libnvidia-ml.so.1", 0)  # ctypes.CDLL's mode (RTLD_NOW added)
    except OSError:
        return GpuFacts(sm=None, source="unknown",
                        warning="no NVIDIA driver found (NVML: NVML Shared Library Not Found): "
                                "GPU checks skipped")
    _ctypes.dlclose(handle)
    return None


def _first_visible(count: int) -> int:
    """The NVML index of CUDA device 0 when CUDA_VISIBLE_DEVICES names one by number."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.isdigit() and int(visible) < count:
        return int(visible)
    return 0


def _nvml_text(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__


def resolve_gpu(gpu_sm: str) -> GpuFacts:
    """The GPU facts for a `--gpu-sm` value (probing NVML for `auto`)."""
    return parse_gpu_sm(gpu_sm) or probe_gpu()
