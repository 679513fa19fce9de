"""Fatal lines of the shipped packs, and log lines that quote them without being SGLang's
error output (--log-requests records, access lines, quoted strings): issue 12's attack."""

from __future__ import annotations

import json
import tomllib
import urllib.parse
from pathlib import Path

from sglang_guard.rules.logline import error_text

DATA = Path(__file__).resolve().parent / "data"
MESSAGES: list[dict[str, str]] = tomllib.loads(
    (DATA / "sglang-messages-0.5.23.toml").read_text(encoding="utf-8"))["message"]
TS = "[2026-11-29 16:50:40]"

# The real lines of the environment rules (configs/rules/environment.toml), as the public
# reports cited there show them: (line, rule, words the diagnosis must name).
ENV_LINES = [
    ("ImportError: /usr/local/lib/python3.10/dist-packages/sgl_kernel/common_ops.abi3.so: "
     "undefined symbol: _ZN3c104cuda9SetDeviceEa", "env-sgl-kernel-undefined-symbol",
     ["sgl_kernel/common_ops.abi3.so", "_ZN3c104cuda9SetDeviceEa"]),
    ("- ImportError: /usr/local/lib/python3.10/dist-packages/sgl_kernel/sm100/common_ops.abi3.so"
     ": undefined symbol: _ZNK3c106SymInt6sym_neERKS0_", "env-sgl-kernel-undefined-symbol",
     ["sm100/common_ops.abi3.so", "_ZNK3c106SymInt6sym_neERKS0_"]),
    ("ImportError: libnvrtc.so.12: cannot open shared object file: No such file or directory",
     "env-cuda-library-missing", ["libnvrtc.so.12"]),
    ("ImportError: libcudart.so.12: cannot open shared object file: No such file or directory",
     "env-cuda-library-missing", ["libcudart.so.12"]),
    ("RuntimeError: RMSNorm failed with error code no kernel image is available for execution "
     "on the device", "env-no-kernel-image", ["SM"]),
    ("RuntimeError: cuDNN version incompatibility: PyTorch was compiled  against (8, 5, 0) but "
     "found runtime version (8, 4, 1). PyTorch already comes bundled with cuDNN.",
     "env-cudnn-version", ["(8, 5, 0)", "(8, 4, 1)"]),
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please "
     "update your GPU driver", "env-driver-too-old", ["11040"]),
]
FATAL_TEXTS = [m["text"] for m in MESSAGES] + [line for line, _, _ in ENV_LINES]


def _message(text: str) -> str:
    """The message inside a fatal line, as a client would quote it (prefixes stripped)."""
    found = error_text(text)
    return found[0] if found else text


def quoting(text: str) -> list[str]:
    """Log lines that carry `text` without being SGLang's error output."""
    msg = _message(text)
    rid = "9f1c0e"
    return [
        # --log-requests, text format (srt/utils/request_logger.py:116, :197): repr() quotes.
        f"{TS} Receive: obj=GenerateReqInput(rid={rid!r}, text={text!r}, input_ids=None, "
        f"sampling_params={{'max_new_tokens': 8}}, stream=False)",
        f"{TS} Receive: obj=GenerateReqInput(rid={rid!r}, text={msg!r}, input_ids=None)",
        f"{TS} Finish: obj=GenerateReqInput(rid={rid!r}, text={msg!r}), "
        f"out={{'text': {text!r}, 'meta_info': {{'id': {rid!r}}}}}",
        # --log-requests-format json (srt/utils/log_utils.py:68)
        f"{TS} " + json.dumps({"event": "request.received", "obj": {"text": text}},
                              ensure_ascii=False),
        # the OpenAI route's record, and a chat message with it
        f"{TS} Receive OpenAI: obj={{'messages': [{{'role': 'user', 'content': {text!r}}}]}}",
        # uvicorn's access line (the text in the query string, URL-quoted or not)
        f'{TS} INFO:     127.0.0.1:51244 - "POST /generate?q={urllib.parse.quote(msg)} '
        'HTTP/1.1" 200 OK',
        f'{TS} INFO:     127.0.0.1:51244 - "GET /{msg} HTTP/1.1" 404 Not Found',
        # SGLang's request error record (srt/entrypoints/http_server.py:973) and an exception
        # whose message quotes the request
        f"{TS} [http_server] Error: invalid stop string {text!r}",
        f"ValueError: invalid stop string {text!r}",
        f'RuntimeError: request "{msg}" was aborted',
    ]
