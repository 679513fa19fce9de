"""The guard reads every tiny model's attention architecture exactly as SGLang 0.5.23 does.

SGLang's answer comes from `ModelConfig(...).attention_arch` in the real venv (oracle.py arch,
one process for the whole batch); the guard's from `resolve_model` in this python.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.shell.modelprobe import resolve_model

from .models import MODELS, TinyModel

pytestmark = pytest.mark.e2e

BY_NAME = {m.name: m for m in MODELS}


@pytest.fixture(autouse=True)
def _private_facts_cache(tmp_path: Path) -> Iterator[None]:
    # The guard memoises model facts on disk; a stale entry must not answer for the code.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLANG_GUARD_CACHE", str(tmp_path / "guard-cache"))
        yield


def _describe(model: TinyModel) -> str:
    flags = []
    if model.is_draft:
        flags.append("as draft")
    if model.override_args:
        flags.append(f"--json-model-override-args {model.override_args}")
    return model.name + (f" ({', '.join(flags)})" if flags else "")


def test_enough_families() -> None:
    """The conformance set stays broad: 25+ configs, all three architectures, drafts."""
    assert len(MODELS) >= 25
    assert {m.expect for m in MODELS} == {"mla", "mha", "ssm"}
    assert sum(m.is_draft for m in MODELS) >= 8
    assert len(BY_NAME) == len(MODELS), "model names must be unique"


@pytest.mark.parametrize("name", list(BY_NAME))
def test_sglang_reads_the_model_as_documented(name: str, sglang_arch: dict[str, Any]) -> None:
    """SGLang itself loads each tiny model and gives the architecture models.py documents."""
    model, row = BY_NAME[name], sglang_arch[name]
    assert row["error"] is None, f"SGLang 0.5.23 cannot load {_describe(model)}: {row['error']}"
    assert row["attention_arch"] == model.expect, (
        f"{_describe(model)}: SGLang 0.5.23 says {row['attention_arch']} "
        f"(architectures {row['architectures']}), models.py expects {model.expect}"
    )


@pytest.mark.parametrize("name", list(BY_NAME))
def test_guard_agrees_with_sglang(
    name: str, sglang_arch: dict[str, Any], tiny_model_dirs: dict[str, Path]
) -> None:
    """resolve_model's attention_arch and architectures equal SGLang's for the same input."""
    model, row = BY_NAME[name], sglang_arch[name]
    if row["error"] is not None:
        pytest.fail(f"SGLang could not load {_describe(model)}: {row['error']}", pytrace=False)
    facts = resolve_model(str(tiny_model_dirs[name]), override_args=model.override_args,
                          is_draft=model.is_draft)
    assert facts.attention_arch == row["attention_arch"], (
        f"{_describe(model)}: the guard says {facts.attention_arch} "
        f"(architectures {list(facts.architectures)}, warning {facts.warning!r}), "
        f"SGLang 0.5.23 says {row['attention_arch']} (architectures {row['architectures']})"
    )
    assert list(facts.architectures) == row["architectures"], (
        f"{_describe(model)}: the guard renames to {list(facts.architectures)}, "
        f"SGLang 0.5.23 to {row['architectures']}"
    )
