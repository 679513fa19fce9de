"""`check` reads a pasted command line whole: its launcher (python -m sglang.launch_server,
the drop-in, `sglang serve`, leading environment words) is left out and the decision is the
one for the bare arguments; a `sglang serve` line SGLang hands to another backend is said to
be unchecked (exit 0). Whole processes, plain and through click."""

from __future__ import annotations

import http.server
import json
import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

REPO = Path(__file__).resolve().parents[2]
LLAMA = str(REPO / "configs" / "models" / "tiny-llama")
BARE = ["--model-path", LLAMA, "--attention-backend", "cutedsl_mla", "--tp", "1"]
CLICK_WAY = "import sys; from sglang_guard import cli; sys.argv[0] = 'sglang-guard'; cli.main()"


def _check(words: list[str], cache: Path, *, click: bool = False, release: str | None = None
           ) -> tuple[int, str, str]:
    env = {**os.environ, "SGLANG_GUARD_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error"}
    cmd = [sys.executable, "-c", CLICK_WAY] if click else [sys.executable, "-m", "sglang_guard"]
    pinned = ["--sglang-version", release] if release else []
    done = subprocess.run([*cmd, "check", "--json", "--gpu-sm", "90", *pinned, "--", *words],
                          env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("prefix", [
    ["python3", "-m", "sglang.launch_server"],
    ["CUDA_VISIBLE_DEVICES=0", "/opt/venv/bin/python", "-m", "sglang.launch_server"],
    ["sglang-guard-launch"], ["sglang", "serve"], ["/venv/bin/sglang", "serve"],
])
def test_a_launcher_prefix_decides_as_the_bare_arguments(prefix: list[str], tmp_path: Path
                                                         ) -> None:
    pytest.importorskip("transformers")
    bare = _check(BARE, tmp_path)
    assert bare[0] == 1, bare[2]  # cutedsl_mla on a Llama: remediated
    for said in (_check([*prefix, *BARE], tmp_path),
                 _check([*prefix, *BARE], tmp_path, click=True)):
        assert said[0] == bare[0] and said[2] == bare[2]
        doc, bare_doc = json.loads(said[1]), json.loads(bare[1])
        # a launcher named by a path that is not here: the same table, and the line says why
        source = doc.pop("sglang_version_source")
        assert source == bare_doc.pop("sglang_version_source") or (
            "is not on this machine" in source)
        assert doc == bare_doc


@pytest.mark.parametrize("prefix", [
    [], ["HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789", "python3", "-m",
         "sglang.launch_server"],
    ["sglang", "serve", "--model-type", "llm"], ["/usr/bin/sglang-guard-launch"],
])
def test_the_fixed_command_starts_with_the_checked_lines_launcher(prefix: list[str],
                                                                   tmp_path: Path) -> None:
    """The human report's "command" line is the pasted line's own launcher (a token in an
    environment word masked) and the fixed arguments, ready to run as it was."""
    pytest.importorskip("transformers")
    env = {**os.environ, "SGLANG_GUARD_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run([sys.executable, "-m", "sglang_guard", "check", "--gpu-sm", "90",
                           "--", *prefix, *BARE], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 1, done.stderr
    command = next(line for line in done.stdout.splitlines() if line.startswith("command"))
    words = shlex.split(command.removeprefix("command"))
    fixed = json.loads(_check(BARE, tmp_path)[1])["argv_out"]
    head = prefix or ["python", "-m", "sglang.launch_server"]
    if prefix[:1] and prefix[0].startswith("HF_TOKEN="):
        assert "hf_abc" not in done.stdout
        head = [words[0], *prefix[1:]]  # masked
        assert words[0].startswith("HF_TOKEN=")
    assert words == [*head, *fixed]
    assert "cutedsl_mla" not in words


def test_serve_reads_its_positional_model_and_selector(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    bare = _check(BARE, tmp_path)
    assert _check(["sglang", "serve", LLAMA, "--model-type", "llm", *BARE[2:]], tmp_path) == bare


@pytest.mark.parametrize(("release", "words", "said"), [
    ("0.5.4", ["sglang", "serve", "--model-path", LLAMA], "has no `sglang serve`"),
    ("0.5.12", ["sglang", "serve", LLAMA, "--tp", "1"], "--model-path is required"),
    ("0.5.10", ["sglang", "serve", "--model", LLAMA], "--model-path is required"),
    ("0.5.15", ["sglang", "serve", "--model-type", "vision", "--model-path", LLAMA],
     "invalid --model-type 'vision'"),
    ("0.5.23", ["sglang", "serve", "--model-path", LLAMA, "--model-type"],
     "--model-type requires a value"),
])
def test_a_serve_line_the_releases_serve_fails_is_one_clear_line(
        release: str, words: list[str], said: str, tmp_path: Path) -> None:
    """What that release's own serve.py raises before it parses (tests/unit/
    test_serve_reading.py runs each release's functions): exit 2, one line, its words."""
    code, out, err = _check(words, tmp_path, release=release)
    assert code == 2, (out, err)
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert said in err and release in err and "Traceback" not in err


def test_an_older_releases_serve_passes_its_selector_to_the_parser(tmp_path: Path) -> None:
    """0.5.8's serve has no `--model-type` of its own: launch_server's parser rejects it."""
    pytest.importorskip("transformers")
    code, out, err = _check(["sglang", "serve", "--model-type", "llm", *BARE], tmp_path,
                            release="0.5.8")
    assert code == 2, err
    doc = json.loads(out)
    assert doc["verdict"] == "rejected"
    assert [f["flag"] for f in doc["findings"] if f["kind"] == "parser"] == ["--model-type"]


def test_a_serve_line_for_another_backend_is_unchecked(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "model_index.json").write_text('{"_diffusers_version": "0.30.0"}')
    for words in (["sglang", "serve", str(pipe), "--num-gpus", "1"],
                  ["sglang", "serve", "--model-type", "diffusion", "--model-path", LLAMA]):
        code, out, err = _check(words, tmp_path)
        assert code == 0, err
        said = json.loads(out)
        assert said["checked"] is False and said["argv_in"] == words
    # the line is answered as given, its secrets masked as in every decision
    code, out, _ = _check(["sglang", "serve", str(pipe), "--api-key", "sk-abcdef123456",
                           "--admin-api-key=topsecret99"], tmp_path)
    assert code == 0 and "sk-abcdef123456" not in out and "topsecret99" not in out
    assert json.loads(out)["argv_in"][3:] == ["--api-key", "***", "--admin-api-key=***"]
    # the same directory under launch_server is the LLM server's, which cannot read it
    code, _, err = _check(["python", "-m", "sglang.launch_server", "--model-path", str(pipe)],
                          tmp_path)
    assert code == 2 and "has no config.json" in err


class _Hub(http.server.BaseHTTPRequestHandler):
    """A Hugging Face hub of one diffusers repo (org/pipe), as huggingface_hub downloads it:
    HEAD then GET of /<repo>/resolve/<revision>/<file>; anything else is not there."""

    BODY = json.dumps({"_diffusers_version": "0.31.0"}).encode()
    asked: ClassVar[list[str]] = []

    def _answer(self) -> bool:
        self.asked.append(f"{self.command} {self.path}")
        found = self.path == "/org/pipe/resolve/main/model_index.json"
        self.send_response(200 if found else 404)
        if found:
            self.send_header("ETag", '"fake-etag"')
            self.send_header("X-Repo-Commit", "a" * 40)
        else:
            self.send_header("X-Error-Code", "EntryNotFound")
        self.send_header("Content-Length", str(len(self.BODY) if found else 0))
        self.end_headers()
        return found

    def do_HEAD(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        if self._answer():
            self.wfile.write(self.BODY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)  # a free port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_uncached_hub_pipeline_is_fetched_as_sglang_fetches_it(hub: str, tmp_path: Path
                                                                  ) -> None:
    # Online and not in the local cache: model_index.json, the one file SGLang's serve
    # downloads to decide (sglang/cli/utils.py:124-128), is fetched from the hub.
    _Hub.asked.clear()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE",
                                                          "TRANSFORMERS_OFFLINE")}
    env |= {"HF_ENDPOINT": hub, "HF_HOME": str(tmp_path / "hf"),
            "SGLANG_GUARD_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "sglang_guard", "check", "--json", "--",
                           "sglang", "serve", "org/pipe", "--num-gpus", "1"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["checked"] is False and "on the hub" in said["why"]
    assert "GET /org/pipe/resolve/main/model_index.json" in _Hub.asked
