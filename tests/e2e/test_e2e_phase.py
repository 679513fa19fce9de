"""Real SGLang 0.5.23 on CPU (issue 12): requests quoting every fatal pattern, logged by
SGLang's own --log-requests, leave a ready server alone; a start that hangs in distributed
init is reported with its stage and acted on within the stage's limit; a CUDA library that the
dynamic loader cannot find ends the run at once with exit 69.

What the first test exercises, honestly: the tiny model runs with --skip-tokenizer-init, so
a text prompt is rejected (HTTP 400) -- but SGLang logs it first ("Receive: obj=...
text='...'", tokenizer_manager.py:936 logs before it tokenizes); input_ids requests carry
the pattern in their rid (served: a "Finish:" record with it) and in stop strings (rejected,
and SGLang's own "[http_server] Error: stop=['...'] is unavailable" record quotes them). No
request's generated text carries a pattern (the model has no tokenizer). The test checks
SGLang really wrote those lines before it checks the journal.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from requestlines import FATAL_TEXTS
from sglang_guard.errors import EXIT_ENVIRONMENT, EXIT_GIVE_UP, EXIT_OK

from .guardproc import guard_process, guard_run_cmd, post_generate, sglang_args
from .models import write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0


def _post(port: int, body: dict[str, Any]) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_requests_quoting_every_pattern_never_touch_a_ready_server(
        sglang_python: str, tmp_path: Path) -> None:
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port, ["--log-requests", "--log-requests-level", "2"])
    toml = tmp_path / "guard.toml"
    toml.write_text("[health]\nliveness_interval_s = 600.0\n", encoding="utf-8")
    cmd = guard_run_cmd(sglang_python, state, given,
                        options=["--no-preflight", "--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        guard.wait_event("ready", READY_S)
        statuses = []
        for i, text in enumerate(FATAL_TEXTS):
            statuses.append(_post(port, {"text": text, "rid": f"t{i}",
                                         "sampling_params": {"max_new_tokens": 2}}))
            statuses.append(_post(port, {"input_ids": [1, 2, 3], "rid": f"{text} #{i}",
                                         "sampling_params": {"max_new_tokens": 2,
                                                             "stop": [text]}}))
            statuses.append(_post(port, {"input_ids": [1, 2, 3], "rid": f"{text} ok{i}",
                                         "sampling_params": {"max_new_tokens": 2}}))
        assert post_generate(port).get("output_ids"), "the server stopped serving"
        log = guard.log_path.read_text(encoding="utf-8", errors="replace")
        # SGLang itself logged the patterns inside its request records.
        received = [ln for ln in log.splitlines() if "Receive: obj=GenerateReqInput(" in ln]
        finished = [ln for ln in log.splitlines() if "Finish: obj=GenerateReqInput(" in ln]
        assert len(received) >= len(FATAL_TEXTS), f"{len(received)} Receive records"
        for text in FATAL_TEXTS:
            assert any(repr(text) in ln for ln in received), f"not logged: {text!r}"
        # SGLang's own error record quotes the request too: "[http_server] Error: stop=['...']
        # is unavailable when skip_tokenizer_init=True" (http_server.py:973).
        errors = [ln for ln in log.splitlines() if "[http_server] Error: stop=[" in ln]
        for i, text in enumerate(FATAL_TEXTS):
            assert any(repr(f"{text} ok{i}") in ln for ln in finished), f"no Finish: {text!r}"
        assert len(errors) == len(FATAL_TEXTS), f"{len(errors)} error records"
        assert statuses.count(200) == len(FATAL_TEXTS), sorted(set(statuses))
        guard.never("a remediation, crash or give-up",
                    lambda: any(guard.events(e) for e in ("remediated", "crash.detected",
                                                          "give_up.planned", "restored")),
                    5.0)
        assert len(guard.events("child.start")) == 1, guard.describe()
        assert guard.terminate() == EXIT_OK, guard.describe()
        guard.assert_tree_gone()


def test_rank_zero_alone_stalls_in_distributed_init_and_is_given_up(
        sglang_python: str, tmp_path: Path) -> None:
    """--nnodes 2 --node-rank 0 --tp 2 with no second node: waits in dist init forever."""
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port, ["--nnodes", "2", "--node-rank", "0", "--tp", "2",
                                      "--dist-init-addr", f"127.0.0.1:{free_port()}"])
    toml = tmp_path / "guard.toml"
    limit = 20.0
    secret = tmp_path / "group.secret"  # a group starts only with its shared secret (issue 22)
    secret.write_text(os.urandom(16).hex() + "\n", encoding="utf-8")
    secret.chmod(0o600)
    toml.write_text(f"[start]\ninit_s = 300.0\ndist_init_s = {limit}\non_stall = \"give_up\"\n"
                    "[restart]\nstop_grace_s = 5.0\n"
                    f"[group]\nsecret_file = {json.dumps(str(secret))}\n", encoding="utf-8")
    cmd = guard_run_cmd(sglang_python, state, given,
                        options=["--no-preflight", "--config", str(toml)])
    env = {**os.environ, "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}  # TP 2 on CPU needs it
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log", env=env) as guard:
        stage = guard.wait_event("start.stage", 240)
        assert stage.get("stage") == "dist_init", guard.describe()
        stalled = guard.wait_event("start.stalled", limit + 30, allow_exit=True)
        assert stalled.get("stage") == "dist_init", stalled
        assert stalled.get("limit_s") == limit
        assert float(str(stalled.get("silent_s"))) >= limit
        assert stalled.get("line"), stalled
        code = guard.wait_exit(60)
        assert code == EXIT_GIVE_UP, guard.describe()
        assert len(guard.events("child.start")) == 1
        assert not guard.events("ready")
        guard.assert_tree_gone()


SHADOW_C = """#include <Python.h>
extern int nvrtcVersion(int *, int *);
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "orjson", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_orjson(void) { int a, b; nvrtcVersion(&a, &b); return PyModule_Create(&def); }
"""


def _shadow_needing_libnvrtc(python: str, root: Path) -> Path:
    """A compiled `orjson` (SGLang imports it at start) that needs libnvrtc.so.12.

    It is linked against a stub libnvrtc.so.12 that is then left off the loader path, so
    importing it fails in the dynamic loader exactly as an extension built for a CUDA runtime
    that is not installed does (sgl-project/sglang#16052, #10951).
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc to build the shadow extension")
    lib, shadow = root / "lib", root / "shadow"
    lib.mkdir(parents=True)
    shadow.mkdir()
    (root / "nv.c").write_text("int nvrtcVersion(int *a, int *b) { return 0; }\n")
    (root / "m.c").write_text(SHADOW_C)
    info = json.loads(subprocess.run(
        [python, "-c", "import json, sysconfig; print(json.dumps([sysconfig.get_paths()"
                       "['include'], sysconfig.get_config_var('EXT_SUFFIX')]))"],
        capture_output=True, text=True, check=True).stdout)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib / "libnvrtc.so.12"),
                    "-Wl,-soname,libnvrtc.so.12", str(root / "nv.c")], check=True)
    subprocess.run([gcc, "-shared", "-fPIC", f"-I{info[0]}", "-o",
                    str(shadow / f"orjson{info[1]}"), str(root / "m.c"), f"-L{lib}",
                    "-l:libnvrtc.so.12"], check=True)
    return shadow


def test_a_missing_cuda_library_is_one_launch_and_exit_69(
        sglang_python: str, tmp_path: Path) -> None:
    shadow = _shadow_needing_libnvrtc(sglang_python, tmp_path / "so")
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    toml = tmp_path / "guard.toml"
    toml.write_text("[restart]\nmax_failures = 5\nbackoff_initial_s = 0.1\n", encoding="utf-8")
    cmd = guard_run_cmd(sglang_python, state, sglang_args(model, port),
                        options=["--no-preflight", "--config", str(toml)])
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log", env=env) as guard:
        code = guard.wait_exit(240)
        assert code == EXIT_ENVIRONMENT, guard.describe()
        assert len(guard.events("child.start")) == 1, guard.describe()
        (planned,) = guard.events("give_up.planned")
        assert planned.get("class") == "environment", planned
        assert planned.get("rule") == "env-cuda-library-missing", planned
        assert "libnvrtc.so.12" in str(planned.get("reason")), planned
        assert "ImportError: libnvrtc.so.12: cannot open shared object file" in str(
            planned.get("line")), planned
        guard.assert_tree_gone()
