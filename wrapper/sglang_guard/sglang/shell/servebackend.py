"""Which `sglang serve` command lines SGLang would not serve with the LLM server.

`sglang serve` also serves diffusion pipelines, with SGLang's diffusion runtime
(sglang/cli/serve.py:109-118 `_detect_diffusion`, :211 `auto_detect`), whose flags, defaults
and error output none of the guard's tables describe: the guard must neither check such a
line by launch_server's rules nor supervise it (serve.hand_over, checkcmd.py). Reads the model
directory (or the local Hugging Face cache) as SGLang does; tests/e2e/test_conformance_serve.py
holds it to each release's own dispatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sglang_guard.common.shell import hub
from sglang_guard.sglang.launcher import ServeReading, model_path_of, selected_backend

# Which files make a local directory a diffusers pipeline, for SGLang 0.5.23's `sglang serve`
# (sglang/cli/utils.py:70-77 `_is_diffusers_model_dir`: the first that exists decides, by a
# "_diffusers_version" key; 0.5.18 reads only model_index.json: utils.py:37-46).
_PIPELINE_INDEXES = ("model_index.json", "modular_model_index.json")
_INDEX_LIMIT = 1 << 20  # a pipeline index is a few hundred bytes; more is not one


def _is_pipeline_dir(directory: Path) -> bool:
    import json  # noqa: PLC0415 - only a serve command reads a pipeline index

    for name in _PIPELINE_INDEXES:
        index = directory / name
        if index.is_file():
            try:
                with index.open("rb") as fh:
                    data = json.loads(fh.read(_INDEX_LIMIT))
            except (OSError, ValueError):
                return False  # SGLang's json.load raises; its detector then says no match
            # SGLang's own test, whatever the JSON holds: a list or a string that contains
            # the word passes it too; a number raises, and its detector says no match.
            return isinstance(data, dict | list | str) and "_diffusers_version" in data
    return False


def _hub_pipeline_index(repo_id: str) -> Path | None:
    """The hub model's model_index.json, as SGLang fetches it (utils.py:124-128: a download
    of that one file): from the local Hugging Face cache, else downloaded unless offline
    (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE) or the hub is unreachable. None: none to read;
    SGLang, failing to fetch it, takes the LLM path too (utils.py:129-133)."""
    try:
        from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache  # noqa: PLC0415
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "model_index.json")
    except ValueError:  # not a repo id
        return None
    if isinstance(found, str):
        return Path(found)
    # The cache knows the repo has none; or offline; or the hub is not there.
    if found is not None or hub.offline() or hub.unreachable(constants.ENDPOINT) is not None:
        return None
    try:
        return Path(hf_hub_download(repo_id, "model_index.json", etag_timeout=10))
    except Exception:  # SGLang's own `except Exception` (utils.py:129): not a pipeline
        return None


def backend(own: Sequence[str], server_args: Sequence[str],
            reading: ServeReading | None = None) -> str | None:
    """Why SGLang would not serve this with the LLM server (then the guard, which knows only
    that one, must not judge it), or None: it is the LLM server's.

    As SGLang 0.5.23 decides: `--model-type` other than llm/auto selects another backend
    (diffusion, or an installed out-of-tree one: serve_backends.py); under auto, a model
    directory with a diffusers pipeline index (utils.py:111-112), a hub model whose
    model_index.json is one (utils.py:124-128, `_hub_pipeline_index`), or an explicit
    `--pipeline-class-name` (serve.py:113-116; SGLang
    checks it against its pipeline registry, which only its diffusion runtime holds).
    `reading`: the release's reading of the words (launcher.serve_reading; None: the
    newest), for which spellings name the model.
    """
    chosen = selected_backend(own)
    if chosen not in ("auto", "llm"):
        return f"--model-type {chosen} selects SGLang's {chosen} backend"
    if chosen == "llm":
        return None
    path = model_path_of(server_args, reading)
    if path is not None:
        local = Path(path).expanduser()
        if local.is_dir():
            if _is_pipeline_dir(local):
                return f"{path} is a diffusers pipeline (its model index has _diffusers_version)"
        elif (index := _hub_pipeline_index(path)) is not None and _is_pipeline_dir(
                index.parent):
            return f"{path} is a diffusers pipeline (its model_index.json on the hub)"
    if any(a == "--pipeline-class-name" or a.startswith("--pipeline-class-name=")
           for a in server_args):
        return "--pipeline-class-name names a diffusion pipeline"
    return None


