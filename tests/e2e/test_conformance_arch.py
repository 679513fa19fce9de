"""The guard reads every tiny model's attention architecture exactly as each real release does.

SGLang's answer comes from `ModelConfig(...).attention_arch` in the release's real venv
(oracle.py arch, one process per release for the whole batch); the guard's from
`resolve_model(..., sglang_release=R)` in this python, i.e. R's own architecture table.

SGLang 0.5.18 cannot read some of the configs at all; each such model is listed with the
error 0.5.18 gives, and that exact failure is asserted (a release that starts reading one
fails the test, so the list cannot go stale):
- Mamba, Mamba2, FalconMamba: 0.5.18's ModelConfig reads `num_attention_heads`, which an
  SSM config lacks (pure SSM models get their own path only in later releases).
- DeepSeek-V3.2, GLM-MoE-DSA (and their NextN drafts), MiniCPM3: the config files are written
  with transformers 5.19 (SGLang 0.5.23's pin); 0.5.18's pin, transformers 5.12.1, rejects
  5.19's `layer_types` value `indexed_attention` and has no `minicpm3` model type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.preflight.shell.modelprobe import resolve_model

from .conftest import RELEASES
from .models import MODELS, TinyModel

pytestmark = pytest.mark.e2e

BY_NAME = {m.name: m for m in MODELS}
_SSM_0_5_18 = "object has no attribute 'num_attention_heads'"
_DSA_0_5_18 = "but got ['indexed_attention', 'indexed_attention']"
UNREADABLE: dict[str, dict[str, str]] = {
    "0.5.23": {},
    "0.5.18": {
        "mamba": f"'MambaConfig' {_SSM_0_5_18}",
        "mamba2": f"'Mamba2Config' {_SSM_0_5_18}",
        "falcon-mamba": f"'FalconMambaConfig' {_SSM_0_5_18}",
        "deepseek-v32": _DSA_0_5_18,
        "deepseek-v32-nextn": _DSA_0_5_18,
        "glm-moe-dsa": _DSA_0_5_18,
        "glm-moe-dsa-nextn": _DSA_0_5_18,
        "minicpm3": "model type `minicpm3` but Transformers does not recognize",
    },
}
ALL = [(r, n) for r in RELEASES for n in BY_NAME]
READABLE = [(r, n) for r, n in ALL if n not in UNREADABLE[r]]


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
    for release, names in UNREADABLE.items():
        assert set(names) <= set(BY_NAME), f"{release}: unknown models {set(names) - set(BY_NAME)}"
        # Most of the set must stay comparable on every release.
        assert len(BY_NAME) - len(names) >= 25, release


@pytest.mark.parametrize(("release", "name"), ALL)
def test_sglang_reads_the_model_as_documented(
    release: str, name: str, sglang_arch: Callable[[str], dict[str, Any]]
) -> None:
    """SGLang itself loads each tiny model and gives the architecture models.py documents
    (or, for a model the release cannot read, fails with the documented error)."""
    model, row = BY_NAME[name], sglang_arch(release)[name]
    unreadable = UNREADABLE[release].get(name)
    if unreadable is not None:
        assert row["error"] is not None and unreadable in row["error"], (
            f"SGLang {release} was expected to fail on {_describe(model)} with {unreadable!r}; "
            f"it gave attention_arch={row['attention_arch']}, error={row['error']!r}")
        return
    assert row["error"] is None, (
        f"SGLang {release} cannot load {_describe(model)}: {row['error']}")
    assert row["attention_arch"] == model.expect, (
        f"{_describe(model)}: SGLang {release} says {row['attention_arch']} "
        f"(architectures {row['architectures']}), models.py expects {model.expect}"
    )


@pytest.mark.parametrize(("release", "name"), READABLE)
def test_guard_agrees_with_sglang(
    release: str, name: str, sglang_arch: Callable[[str], dict[str, Any]],
    tiny_model_dirs: dict[str, Path],
) -> None:
    """resolve_model's attention_arch and architectures, for `release`, equal that release's
    own for the same input."""
    model, row = BY_NAME[name], sglang_arch(release)[name]
    if row["error"] is not None:
        pytest.fail(f"SGLang {release} could not load {_describe(model)}: {row['error']}",
                    pytrace=False)
    facts = resolve_model(str(tiny_model_dirs[name]), override_args=model.override_args,
                          is_draft=model.is_draft, sglang_release=release)
    assert facts.attention_arch == row["attention_arch"], (
        f"{_describe(model)}: the guard (for {release}) says {facts.attention_arch} "
        f"(architectures {list(facts.architectures)}, warning {facts.warning!r}), "
        f"SGLang {release} says {row['attention_arch']} (architectures {row['architectures']})"
    )
    assert list(facts.architectures) == row["architectures"], (
        f"{_describe(model)}: the guard (for {release}) renames to "
        f"{list(facts.architectures)}, SGLang {release} to {row['architectures']}"
    )
