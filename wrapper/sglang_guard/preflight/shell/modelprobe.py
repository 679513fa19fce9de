"""Resolve a model path to ModelFacts with transformers' AutoConfig, as SGLang would.

AutoConfig is the source of truth; a small on-disk cache memoises its answer, keyed by the
config.json bytes, the transformers version, the override args and the guard's own table,
so a second `check` does not pay for importing transformers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sglang_guard.common.sha import sha256
from sglang_guard.common.shell import hub
from sglang_guard.common.shell.files import read_bytes, write_atomic
from sglang_guard.config.limits import MAX_JSON_BYTES, LimitError, check_json
from sglang_guard.errors import InputError, ModelError
from sglang_guard.preflight.arch import (
    ArchTable,
    classify,
    draft_architectures,
    load_default_arch_table,
)
from sglang_guard.preflight.facts import CONFIG_FIELDS, ModelFacts, ModelShape
from sglang_guard.resources import config_path

_PROBE_COMMAND = (sys.executable, "-m", "sglang_guard.preflight.shell.modelprobe")
PROBE_TIMEOUT_S = 600

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_TEXT_CONFIG_ATTRS = ("thinker_config", "llm_config", "language_config", "text_config")
# 2: the model shape (heads, MLP widths, context, quantization); 4: config_fields
_CACHE_VERSION = "4"
# SGLang's CONTEXT_LENGTH_KEYS (srt/utils/hf_transformers/common.py:668, 0.5.23): first found wins.
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                 "max_position_embeddings")


# Who answers a cache miss with the facts' JSON before this process imports transformers:
# set by warmprobe.py where a cold `check` forked a child that imports it (None: nobody, or
# the answer is None: resolve here).
ask_warm: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None


def cache_root() -> Path:
    """The guard's cache (`$SGLANG_GUARD_CACHE`, else ~/.cache/sglang-guard)."""
    return Path(os.environ.get("SGLANG_GUARD_CACHE") or Path.home() / ".cache" / "sglang-guard")


def cache_dir() -> Path:
    """Where memoised model facts live (`facts/` in the cache)."""
    return cache_root() / "facts"


def parse_overrides(override_args: str | None) -> dict[str, Any]:
    """`--json-model-override-args` as a dict (SGLang json.loads it the same way)."""
    if not override_args:
        return {}
    try:
        check_json(override_args, "--json-model-override-args")
    except LimitError as exc:
        raise InputError(str(exc)) from None
    try:
        data = json.loads(override_args)
    except ValueError as exc:
        raise InputError(f"--json-model-override-args is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError("--json-model-override-args must be a JSON object")
    return data


def resolve_model(
    path: str,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    override_args: str | None = None,
    is_draft: bool = False,
    use_cache: bool = True,
    isolate: bool = False,
    sglang_release: str | None = None,
) -> ModelFacts:
    """The model's facts; an unresolvable hub id gives `unknown` with a warning.

    With `isolate`, a cache miss is resolved in a short-lived subprocess, so that a
    long-running supervisor never carries transformers in its memory.
    """
    overrides = parse_overrides(override_args)
    local = Path(path).expanduser()
    if local.exists():
        raw = _read_local_config(local)
        if raw is None:
            return ModelFacts(path, (), "unknown", None,
                              f"{path} has no config.json (GGUF or Mistral-format checkpoint?): "
                              "architecture checks skipped")
    elif _looks_like_path(path):
        raise ModelError(f"model path {path!r} does not exist")
    else:
        raw, why = _hub_config_bytes(path, revision)
        if raw is None:
            return ModelFacts(path, (), "unknown", None,
                              f"cannot resolve hub model {path!r} ({why}): architecture checks "
                              "skipped")
        try:
            check_json(raw, f"config.json of {path}")
        except LimitError as exc:
            raise ModelError(str(exc)) from None
    key = _cache_key(raw, revision, trust_remote_code, overrides, is_draft) + (
        f"-{sglang_release}" if sglang_release else "")
    cached = _cache_get(key) if use_cache else None
    if cached is not None:
        return _facts_from(path, cached)
    if not isolate and ask_warm is not None:  # a cold `check`'s child imported transformers
        answer = ask_warm({"path": path, "revision": revision,
                           "trust_remote_code": trust_remote_code,
                           "override_args": override_args, "is_draft": is_draft,
                           "use_cache": use_cache, "sglang_release": sglang_release})
        if answer is not None:
            return _facts_from(path, answer)
    if isolate:
        return _resolve_in_subprocess(path, revision, trust_remote_code,
                                      override_args=override_args, is_draft=is_draft,
                                      sglang_release=sglang_release)
    table = arch_table(sglang_release)  # parsed only on a miss: the cache key covers its text
    archs, model_type, fields, warning, shape = _auto_config(
        path, raw, revision=revision, trust_remote_code=trust_remote_code,
        overrides=overrides, table=table,
    )
    if is_draft:
        archs = draft_architectures(table, archs)
    facts = ModelFacts(path, archs, classify(table, archs, fields) if archs else "unknown",
                       model_type, warning if archs else (warning or "config has no architectures"),
                       shape)
    if use_cache:
        _cache_put(key, facts)
    return facts


def looks_cached(path: str) -> bool:
    """Whether the cache holds facts of the local model at `path` as a line with no
    revision, remote code or overrides reads it, for any release (warmprobe.py's guess)."""
    try:
        raw = _read_local_config(Path(path).expanduser())
    except (ModelError, InputError):
        return True  # resolve_model says what is wrong; nothing to warm
    if raw is None:
        return True
    key = _cache_key(raw, None, False, {}, False)
    return any(cache_dir().glob(f"{key}*.json"))


def warm_transformers() -> None:
    """Import transformers as `_auto_config` would (`_classes`) before any model is asked
    for (warmprobe.py's child); a missing transformers is left for the resolve to meet."""
    with contextlib.suppress(ModelError):
        _classes()


def arch_table(release: str | None) -> ArchTable:
    """The architecture table as SGLang `release` classifies (None: the shipped one's release)."""
    table = load_default_arch_table()
    if release is None or release == table.sglang_version:
        return table
    from sglang_guard.preflight.arch import for_release  # noqa: PLC0415
    from sglang_guard.sglang.releases import load_release  # noqa: PLC0415

    a = load_release(release).arch
    return for_release(table, release, mla=a.mla, mla_conditional=a.mla_conditional, mha=a.mha,
                       ssm=a.ssm, draft_renames={**a.draft_renames, **a.draft_renames_conditional})


def _resolve_in_subprocess(path: str, revision: str | None, trust: bool, *,
                           override_args: str | None, is_draft: bool,
                           sglang_release: str | None) -> ModelFacts:
    request = json.dumps({"path": path, "revision": revision, "trust_remote_code": trust,
                          "override_args": override_args, "is_draft": is_draft,
                          "sglang_release": sglang_release})
    import subprocess  # noqa: PLC0415 - a cached check starts no probe

    from sglang_guard.supervise.shell.jobs import tracked  # noqa: PLC0415

    # Run as a tracked process: a loop that ends while a reload probes (supervise/shell/jobs.py)
    # stops it.
    with subprocess.Popen(list(_PROBE_COMMAND), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc, tracked(proc):
        try:
            stdout, stderr = proc.communicate(request, timeout=PROBE_TIMEOUT_S)
        except BaseException:  # a timeout, an early stop signal: the probe goes too
            proc.kill()  # (as subprocess.run does)
            raise
    try:
        answer = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ModelError(f"resolving {path!r} failed: {last[-300:]}") from None
    if "error" in answer:
        raise ModelError(answer["error"])
    return _facts_from(path, answer)


def _facts_from(path: str, data: dict[str, Any]) -> ModelFacts:
    """ModelFacts from the JSON of the cache or the subprocess."""
    return ModelFacts(path, tuple(data["architectures"]), data["attention_arch"],
                      data["model_type"], data["warning"], ModelShape.from_dict(data.get("shape")))


def facts_json(facts: ModelFacts) -> str:
    return json.dumps({"architectures": list(facts.architectures),
                       "attention_arch": facts.attention_arch,
                       "model_type": facts.model_type, "warning": facts.warning,
                       "shape": facts.shape.as_dict() if facts.shape else None})


def _main() -> None:
    """`python -m sglang_guard.preflight.shell.modelprobe`: resolve one model given as JSON on
    stdin."""
    req = json.loads(sys.stdin.read())
    try:
        facts = resolve_model(req["path"], revision=req["revision"],
                              trust_remote_code=req["trust_remote_code"],
                              override_args=req["override_args"], is_draft=req["is_draft"],
                              sglang_release=req.get("sglang_release"))
    except InputError as exc:
        print(json.dumps({"error": str(exc)}))
        return
    except Exception as exc:
        print(json.dumps({"error": f"resolving {req['path']!r} failed: {_first_line(exc)}"}))
        return
    print(facts_json(facts))


def _looks_like_path(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or path.endswith("/") or not _HUB_ID.match(path)


def _read_local_config(local: Path) -> bytes | None:
    """config.json's bytes; None for checkpoints SGLang reads another way (GGUF, Mistral)."""
    if local.is_file():
        if local.suffix == ".gguf":
            return None
        raise ModelError(f"model path {str(local)!r} is a file, not a model directory")
    cfg = local / "config.json"
    if not cfg.exists():
        if (local / "params.json").exists() or any(local.glob("*.gguf")):
            return None
        raise ModelError(f"model directory {str(local)!r} has no config.json")
    try:
        raw = read_bytes(cfg, limit=MAX_JSON_BYTES)
    except OSError as exc:
        raise ModelError(f"cannot read {cfg}: {exc.strerror}") from exc
    try:
        check_json(raw, str(cfg))
    except LimitError as exc:
        raise ModelError(str(exc)) from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        detail = "the file is empty" if not raw.strip() else str(exc)
        raise ModelError(f"{cfg} is not valid JSON ({detail})") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{cfg} must hold a JSON object, not {type(data).__name__}")
    return raw


def _hub_config_bytes(repo_id: str, revision: str | None) -> tuple[bytes | None, str]:
    """config.json of a hub model (from the local cache, or downloaded when SGLang would),
    or None and why not."""
    try:
        from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache  # noqa: PLC0415
        from huggingface_hub.errors import HfHubHTTPError  # noqa: PLC0415
        from huggingface_hub.utils import logging as hf_logging  # noqa: PLC0415
    except ImportError:
        return None, "huggingface_hub is not installed"
    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if isinstance(cached, str):
        return read_bytes(cached), ""
    if hub.offline():
        return None, "offline and not in the local Hugging Face cache"
    host = hub.unreachable(constants.ENDPOINT)
    if host is not None:
        return None, f"{host} is unreachable and the model is not in the local cache"
    # SGLang would download this model at start; fetching its config.json first is the
    # smallest part of what it would fetch anyway.
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        got = hf_hub_download(repo_id, "config.json", revision=revision, etag_timeout=10)
    except (OSError, ValueError, HfHubHTTPError) as exc:
        return None, f"download failed: {str(exc).splitlines()[0][:120]}"
    return read_bytes(got), ""


ENV_FAST = "SGLANG_GUARD_TRANSFORMERS_FAST"  # "0": always the normal `import transformers`
_BARE = ("transformers", "transformers.models", "transformers.models.auto")


class _FastPathBroken(Exception):
    """The bare-package import met a transformers that does not fit it: import it normally."""


_fast_classes: tuple[Any, Any] | None = None  # (AutoConfig, PretrainedConfig), the fast way


def _auto_config(
    path: str,
    raw: bytes,
    *,
    revision: str | None,
    trust_remote_code: bool,
    overrides: Mapping[str, Any],
    table: ArchTable,
) -> tuple[tuple[str, ...], str | None, dict[str, Any], str | None, ModelShape]:
    """Load with AutoConfig (as SGLang's get_config does), apply overrides, read the text config.

    The fast way first (`_fast_transformers`); where that meets a transformers it does not
    fit (an import or attribute error anywhere in it), the normal import, from scratch.
    """
    global _fast_classes  # noqa: PLW0603 - what this process imported, once
    classes, fast = _classes()
    if fast:
        try:
            return _auto_config_with(classes, path, raw, revision=revision,
                                     trust_remote_code=trust_remote_code,
                                     overrides=overrides, table=table, fast=True)
        except _FastPathBroken:
            _fast_classes = None
            _forget_transformers()
        classes = _transformers()
    return _auto_config_with(classes, path, raw, revision=revision,
                             trust_remote_code=trust_remote_code, overrides=overrides,
                             table=table, fast=False)


def _classes() -> tuple[tuple[Any, Any], bool]:
    """(AutoConfig, PretrainedConfig), and whether they came the fast way: the fast way where
    it is on and transformers is not imported yet (or came that way before); else, or where
    the fast way does not fit, the normal import (ModelError: transformers is missing)."""
    global _fast_classes  # noqa: PLW0603
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if (_fast_classes is None and os.environ.get(ENV_FAST, "1") != "0"
            and "transformers" not in sys.modules):
        try:
            _fast_classes = _fast_transformers()
        except _FastPathBroken:
            _forget_transformers()
    if _fast_classes is not None:
        return _fast_classes, True
    return _transformers(), False


def _transformers() -> tuple[Any, Any]:
    """(AutoConfig, PretrainedConfig) through `import transformers`."""
    try:
        from transformers import AutoConfig, PretrainedConfig  # noqa: PLC0415 - slow, once
    except ImportError:
        raise ModelError("transformers is not installed for this Python: the guard reads model "
                         "configs with it (pip install 'transformers>=5')") from None
    return AutoConfig, PretrainedConfig


def _fast_transformers() -> tuple[Any, Any]:
    """(AutoConfig, PretrainedConfig) without running transformers' package `__init__` files.

    `import transformers` builds its lazy import table by reading ~1,700 model files (~0.6 s
    of a cold `check`); AutoConfig needs none of them. `transformers`, `transformers.models`
    and `transformers.models.auto` are put in sys.modules as bare packages over their real
    directories (with `__version__`, which configuration_utils imports from the top), so
    that `transformers.models.auto.configuration_auto` imports alone; a model's own config
    module still imports through its real package. This relies on transformers' layout:
    any import or attribute error raises _FastPathBroken, and the caller imports normally
    (tests/unit/test_modelprobe_fast.py holds the two ways to the same answers).
    """
    import importlib.util  # noqa: PLC0415
    import types  # noqa: PLC0415

    found = _transformers_package()
    if found is None:
        raise _FastPathBroken("transformers is not a package here")
    root, version = found
    if version is None:
        raise _FastPathBroken("no __version__ line in transformers/__init__.py")
    for name in _BARE:
        where = root.joinpath(*name.split(".")[1:])
        if not (where / "__init__.py").is_file():
            raise _FastPathBroken(f"{where} is not a package")
        module = types.ModuleType(name)
        module.__path__ = [str(where)]
        module.__file__ = str(where / "__init__.py")
        module.__package__ = name
        module.__spec__ = importlib.util.spec_from_file_location(
            name, where / "__init__.py", submodule_search_locations=[str(where)])
        module.__getattr__ = _submodule_getter(name)  # type: ignore[method-assign]
        sys.modules[name] = module
    sys.modules["transformers"].__version__ = version  # type: ignore[attr-defined]
    try:
        from transformers.configuration_utils import PretrainedConfig  # noqa: PLC0415
        from transformers.models.auto.configuration_auto import AutoConfig  # noqa: PLC0415
    except (ImportError, AttributeError, NameError) as exc:
        raise _FastPathBroken(str(exc)) from exc
    return AutoConfig, PretrainedConfig


def _submodule_getter(package: str) -> Any:
    """A module `__getattr__` (PEP 562): `package.x` imports `package.x` when x is a file.

    transformers reaches its submodules as attributes too (`auto.modeling_auto` while it
    writes a config class's docstring); anything else is an AttributeError, as it would be.
    """
    import importlib  # noqa: PLC0415

    def getter(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        try:
            return importlib.import_module(f"{package}.{attr}")
        except ModuleNotFoundError as exc:
            raise AttributeError(f"module {package!r} has no attribute {attr!r}") from exc

    return getter


def _forget_transformers() -> None:
    """Drop every transformers module (bare or real) so that the next import starts afresh."""
    for name in [n for n in sys.modules if n == "transformers" or n.startswith("transformers.")]:
        del sys.modules[name]


def _auto_config_with(
    classes: tuple[Any, Any],
    path: str,
    raw: bytes,
    *,
    revision: str | None,
    trust_remote_code: bool,
    overrides: Mapping[str, Any],
    table: ArchTable,
    fast: bool,
) -> tuple[tuple[str, ...], str | None, dict[str, Any], str | None, ModelShape]:
    AutoConfig, PretrainedConfig = classes
    warning = None
    try:
        config = AutoConfig.from_pretrained(
            path, trust_remote_code=trust_remote_code, revision=revision
        )
    except (ImportError, AttributeError, NameError) as exc:
        if fast:
            raise _FastPathBroken(str(exc)) from exc
        raise ModelError(f"{path}: transformers rejects this config ({_first_line(exc)})"
                         ) from None
    except (ValueError, KeyError, OSError) as exc:
        first = _first_line(exc)
        if not trust_remote_code and _needs_remote_code(raw):
            # SGLang would not run that code either: nothing here says what it would build.
            return (), _model_type(raw), {}, (
                f"{path} needs its own code (auto_map) to load, and remote code is not "
                f"trusted ({first}): architecture checks skipped"), ModelShape()
        # A model_type transformers does not know (SGLang registers its own config classes
        # for those): read the plain fields.
        config = PretrainedConfig.from_dict(json.loads(raw))
        warning = f"AutoConfig could not load it ({first}); read config.json as-is"
    except Exception as exc:
        # (huggingface_hub's StrictDataclass*ValidationError): SGLang's get_config would fail
        # on it too, so it is bad input, not a guard bug.
        raise ModelError(f"{path}: transformers rejects this config ({_first_line(exc)})"
                         ) from None
    for key, value in overrides.items():  # mirrors sglang get_config's override merge
        current = getattr(config, key, None)
        if isinstance(value, dict) and isinstance(current, PretrainedConfig):
            current.update(value)
        elif key in ("rope_scaling", "rope_parameters") and isinstance(value, dict) \
                and isinstance(current, dict):
            setattr(config, key, {**current, **value})
        else:
            setattr(config, key, value)
    archs = tuple(getattr(config, "architectures", None) or ())
    text = _text_config(config, archs)
    wanted = {r.field for r in table.rules if r.field}
    fields = {f: _get(text, f) for f in wanted if _has(text, f)}
    return archs, getattr(config, "model_type", None), fields, warning, _shape(config, text)


def _int(obj: Any, name: str) -> int | None:
    value = _get(obj, name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _context_length(text: Any) -> int:
    """SGLang's get_context_length (srt/utils/hf_transformers/common.py:677, 0.5.23)."""
    rope = _get(text, "rope_scaling")
    factor: Any = 1
    if rope and isinstance(rope, dict):
        factor = rope.get("factor", 1)
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in _CONTEXT_KEYS:
        value = _get(text, key)
        if value is not None:
            return int(factor * value)
    return 2048


def _shape(config: Any, text: Any) -> ModelShape:
    """The numbers the size checks read: heads and widths from the text config (as SGLang's
    hf_text_config), quantization from the top config (ModelConfig._parse_quant_hf_config)."""
    quant = _get(config, "quantization_config") or _get(config, "compression_config")
    quant = quant if isinstance(quant, dict) else (quant.to_dict() if hasattr(quant, "to_dict")
                                                   else None)
    method = quant.get("quant_method") if quant else None
    block = quant.get("weight_block_size") if quant else None
    heads = _int(text, "num_attention_heads")
    try:
        context: int | None = _context_length(text)
    except (TypeError, ValueError):
        context = None
    return ModelShape(
        num_attention_heads=heads,
        num_key_value_heads=_int(text, "num_key_value_heads") or heads,
        intermediate_size=_int(text, "intermediate_size"),
        moe_intermediate_size=_int(text, "moe_intermediate_size"),
        first_k_dense_replace=_int(text, "first_k_dense_replace"),
        context_length=context,
        quant_method=method.lower() if isinstance(method, str) else None,
        weight_block_size=(int(block[0]), int(block[1]))
        if isinstance(block, list | tuple) and len(block) == 2 else None,
        config_fields=tuple(f for f in CONFIG_FIELDS
                            if _get(config, f) is not None or _get(text, f) is not None),
    )


def _first_line(exc: BaseException) -> str:
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    return " ".join(lines[:2])[:200] or type(exc).__name__


def _needs_remote_code(raw: bytes) -> bool:
    with contextlib.suppress(ValueError):
        data = json.loads(raw)
        return isinstance(data, dict) and bool(data.get("auto_map"))
    return False


def _model_type(raw: bytes) -> str | None:
    with contextlib.suppress(ValueError):
        data = json.loads(raw)
        if isinstance(data, dict) and isinstance(data.get("model_type"), str):
            return str(data["model_type"])
    return None


def _text_config(config: Any, archs: tuple[str, ...]) -> Any:
    """SGLang's get_hf_text_config: the sub-config the language model reads."""
    if archs and archs[0].startswith("Llava") and archs[0].endswith("ForCausalLM"):
        return config
    # SGLang tests hasattr(), so the first attribute present decides even when it is None
    # (then the config itself is used), and a thinker's own text_config wins over it.
    for attr in _TEXT_CONFIG_ATTRS:
        if _has(config, attr):
            sub = _get(config, attr)
            if attr == "thinker_config" and sub is not None and _has(sub, "text_config"):
                sub = _get(sub, "text_config")
            return sub if sub is not None else config
    return config


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _has(obj: Any, name: str) -> bool:
    return name in obj if isinstance(obj, dict) else hasattr(obj, name)


def _cache_key(raw: bytes, revision: str | None, trust: bool,
               overrides: Mapping[str, Any], is_draft: bool) -> str:
    h = sha256()
    for part in (
        _CACHE_VERSION,
        _transformers_version(),
        revision or "",
        str(trust),
        json.dumps(overrides, sort_keys=True),
        str(is_draft),
        config_path("attention-arch.toml").read_text(encoding="utf-8"),
    ):
        h.update(part.encode() + b"\0")
    h.update(raw)
    return h.hexdigest()


def _transformers_version() -> str:
    """transformers' version as its `__init__.py` states it ("none": not installed).

    Read from the file rather than through importlib.metadata, whose import (email and
    more) cost a cached `check` ~12 ms; where the file says nothing, metadata answers.
    """
    found = _transformers_package()
    if found is not None and found[1] is not None:
        return found[1]
    from importlib import metadata  # noqa: PLC0415 - the rare case

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "none"


def _transformers_package() -> tuple[Path, str | None] | None:
    """(transformers' package directory, the `__version__` its `__init__.py` sets), without
    importing it; None when it is not an installed package."""
    import importlib.util  # noqa: PLC0415

    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations or spec.origin is None:
        return None
    try:
        text = Path(spec.origin).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    version = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    return Path(next(iter(spec.submodule_search_locations))), version.group(1) if version else None


def _cache_get(key: str) -> dict[str, Any] | None:
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _cache_put(key: str, facts: ModelFacts) -> None:
    body = facts_json(facts)
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
        write_atomic(cache_dir() / f"{key}.json", body)


if __name__ == "__main__":
    _main()
