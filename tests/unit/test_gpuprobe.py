"""`--gpu-sm` parsing and the NVML probe, with a fake NVML module injected."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_guard.errors import InputError
from sglang_guard.preflight.facts import GpuFacts
from sglang_guard.preflight.shell.gpuprobe import parse_gpu_sm, probe_gpu, resolve_gpu


@pytest.mark.parametrize(
    ("text", "sm"),
    [("90", 90), ("9.0", 90), ("sm90", 90), ("SM100", 100), (" 120 ", 120), ("8.6", 86),
     ("10.3", 103), ("12.0", 120), ("80", 80)],
)
def test_parse_gpu_sm_numbers(text: str, sm: int) -> None:
    assert parse_gpu_sm(text) == GpuFacts(sm=sm, source="override")


def test_parse_gpu_sm_words() -> None:
    assert parse_gpu_sm("auto") is None
    assert parse_gpu_sm("AUTO") is None
    assert parse_gpu_sm("none") == GpuFacts(sm=None, source="none")


@pytest.mark.parametrize("text", ["", "hopper", "9", "5", "1000", "-90", "9.0.1", "sm", "nan"])
def test_parse_gpu_sm_rejects(text: str) -> None:
    with pytest.raises(InputError, match="--gpu-sm"):
        parse_gpu_sm(text)


class FakeNvml:
    """Just the NVML calls the probe makes."""

    def __init__(self, caps: list[tuple[int, int]], names: list[Any] | None = None,
                 init_error: Exception | None = None, query_error: Exception | None = None):
        self.caps, self.names = caps, names or [b"NVIDIA H100"] * len(caps)
        self.init_error, self.query_error = init_error, query_error
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.query_error:
            raise self.query_error
        return len(self.caps)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self.caps[h]

    def nvmlDeviceGetName(self, h: int) -> Any:
        return self.names[h]


def test_probe_one_gpu() -> None:
    nvml = FakeNvml([(9, 0)])
    facts = probe_gpu(nvml)
    assert (facts.sm, facts.name, facts.source, facts.notes) == (90, "NVIDIA H100", "nvml", ())
    assert nvml.shutdowns == 1


def test_probe_str_name_and_blackwell() -> None:
    facts = probe_gpu(FakeNvml([(10, 0)], names=["NVIDIA B200"]))
    assert (facts.sm, facts.name) == (100, "NVIDIA B200")


def test_probe_mixed_host_uses_first_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([(8, 0), (9, 0)], names=[b"A100", b"H100"])
    facts = probe_gpu(nvml)
    assert (facts.sm, facts.name) == (80, "A100")
    assert facts.notes and "more than one compute capability" in facts.notes[0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert probe_gpu(nvml).sm == 90
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # out of range: first GPU
    assert probe_gpu(nvml).sm == 80
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")  # a UUID: cannot map, first GPU
    assert probe_gpu(nvml).sm == 80


@pytest.mark.parametrize(
    ("nvml", "needle"),
    [
        (FakeNvml([], init_error=RuntimeError("Driver Not Loaded")), "no NVIDIA driver"),
        (FakeNvml([]), "NVML sees no GPU"),
        (FakeNvml([(9, 0)], query_error=RuntimeError("")), "NVML query failed (RuntimeError)"),
    ],
)
def test_probe_cannot_tell(nvml: FakeNvml, needle: str) -> None:
    facts = probe_gpu(nvml)
    assert (facts.sm, facts.source, facts.known) == (None, "unknown", False)
    assert facts.warning is not None and needle in facts.warning


def test_resolve_gpu_override_skips_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang_guard.preflight.shell.gpuprobe as gp  # noqa: PLC0415

    monkeypatch.setattr(gp, "probe_gpu", lambda nvml=None: pytest.fail("probed"))
    assert resolve_gpu("100").sm == 100
    assert resolve_gpu("none").source == "none"


def test_resolve_gpu_auto_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang_guard.preflight.shell.gpuprobe as gp  # noqa: PLC0415

    monkeypatch.setattr(gp, "probe_gpu", lambda nvml=None: GpuFacts(sm=120, source="nvml"))
    assert resolve_gpu("auto").sm == 120
