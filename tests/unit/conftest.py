"""Unit-test fixtures: an offline Hugging Face hub, a private facts cache, no stray configs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sglang_guard.rules import linescan
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.releases import load_option_table


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test reaches the network, the user's caches or the user's guard config."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("SGLANG_GUARD_CACHE", str(home / "cache"))
    monkeypatch.setenv("SGLANG_GUARD_STATE_DIR", str(home / "state"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.delenv("SGLANG_GUARD_CONFIG", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # In-process checks read models through the normal `import transformers`: the fast path
    # puts bare packages in sys.modules for the rest of the process, which would hide
    # LlamaConfig from later tests. test_modelprobe_fast runs that path in subprocesses.
    monkeypatch.setenv("SGLANG_GUARD_TRANSFORMERS_FAST", "0")
    yield


@pytest.fixture(scope="session")
def options() -> OptionTable:
    """SGLang 0.5.23's option table as shipped."""
    return load_option_table()




@pytest.fixture(params=["c", "regex"])
def both_searches(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test once with the traceback tracker's C line search and walk and once with its
    regexes and Python (rules/linescan.py): modules that hold the reader to a per-line pass
    use it for all their tests (`pytestmark = pytest.mark.usefixtures("both_searches")`)."""
    if request.param == "regex":
        monkeypatch.setattr(linescan, "first_line", None)
        monkeypatch.setattr(linescan, "advance", None)
    elif not linescan.compiled:
        pytest.skip("the C line search is not built here")
    return str(request.param)
