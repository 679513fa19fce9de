"""A pasted command line's launcher (sglang/launcher.read_launch)."""

from __future__ import annotations

import pytest

from sglang_guard.sglang.launcher import Launch, is_serve_launch, read_launch

ARGS = ("--model-path", "/m", "--tp", "2")


@pytest.mark.parametrize("prefix", [
    ("python", "-m", "sglang.launch_server"), ("python3", "-m", "sglang.launch_server"),
    ("/opt/venv/bin/python3.11", "-m", "sglang.launch_server"),
    ("CUDA_VISIBLE_DEVICES=0", "NCCL_DEBUG=INFO", "python3", "-m", "sglang.launch_server"),
    ("python", "-m", "sglang_guard.launch_server"), ("/usr/bin/sglang-guard-launch",),
    ("python3", "-u", "-m", "sglang.launch_server"), ("python", "-X", "dev", "-W", "ignore",
    "-OO", "-m", "sglang.launch_server"), ("python", "-Xfaulthandler", "-msglang.launch_server"),
    ("python", "-uB", "-m", "sglang.launch_server"),
])
def test_launch_server_prefixes_are_left_out(prefix: tuple[str, ...]) -> None:
    assert read_launch([*prefix, *ARGS]).args == ARGS
    assert read_launch([*prefix, *ARGS]).form == "launch_server"


@pytest.mark.parametrize("prefix", [("sglang", "serve"), ("/venv/bin/sglang", "serve"),
                                    ("sglang-guard", "serve"), ("HF_HOME=/x", "sglang", "serve")])
def test_serve_prefixes_give_serves_arguments(prefix: tuple[str, ...]) -> None:
    said = read_launch([*prefix, "/m", "--tp", "2"])
    assert (said.form, said.args) == ("serve", ("/m", "--tp", "2"))


def test_the_runner_is_the_launchers_path_only() -> None:
    assert read_launch(["/opt/v/bin/python3", "-m", "sglang.launch_server"]).runner == (
        "/opt/v/bin/python3")
    assert read_launch(["A=1", "/v/bin/sglang", "serve", "m"]).runner == "/v/bin/sglang"
    for words in (["python3", "-m", "sglang.launch_server"], ["sglang", "serve"],
                  ["/usr/bin/sglang-guard", "serve"], ["/usr/bin/sglang-guard-launch"],
                  ["--model-path", "/m"]):
        assert read_launch(words).runner is None, words


@pytest.mark.parametrize("words", [
    ARGS, (), ("python",), ("python", "-m", "other.module", *ARGS), ("pythonic", "-m",
    "sglang.launch_server"), ("sglang", "generate", *ARGS), ("serve", *ARGS),
    ("FOO=1", *ARGS), ("--model-path", "python"), ("python", "-c", "x", "-m",
    "sglang.launch_server"), ("python", "-u"), ("python", "-X"), ("python", "-m"),
    ("python", "-mother", *ARGS), ("python", "--help", "-m", "sglang.launch_server"),
    ("python", "-q", "script.py", "-m", "sglang.launch_server"),
])
def test_anything_else_is_the_arguments_themselves(words: tuple[str, ...]) -> None:
    assert read_launch(words) == Launch("args", tuple(words))


@pytest.mark.parametrize(("name", "python"), [
    ("python", True), ("python3", True), ("python3.11", True), ("python3.11.7", True),
    ("python3.", False), ("python.3", False), ("pythonw", False), ("py", False),
    ("python3.1a", False), ("python٣", False), ("ipython", False),
])
def test_what_names_a_python(name: str, python: bool) -> None:
    words = [f"/usr/bin/{name}", "-m", "sglang.launch_server", "--tp", "1"]
    assert (read_launch(words).form == "launch_server") is python


@pytest.mark.parametrize(("word", "env"), [
    ("A=1", True), ("_X=", True), ("CUDA_VISIBLE_DEVICES=0,1", True), ("A1=b=c", True),
    ("1A=x", False), ("=x", False), ("A-B=1", False), ("A", False), ("É=1", False),
])
def test_what_is_an_environment_word(word: str, env: bool) -> None:
    words = [word, "python", "-m", "sglang.launch_server", "--tp", "1"]
    assert (read_launch(words).form == "launch_server") is env


def test_split_gives_serves_own_options_only_for_a_serve_line() -> None:
    assert read_launch(["sglang", "serve", "/m", "--model-type", "llm", "--tp", "2"]).split() == (
        ("--model-type", "llm"), ("--model-path", "/m", "--tp", "2"))
    assert read_launch(["python", "-m", "sglang.launch_server", "--model-type", "x"]).split() == (
        (), ("--model-type", "x"))  # launch_server's parser judges it: not serve's selector


@pytest.mark.parametrize(("launch", "serve"), [
    (("sglang", "serve"), True), (("/opt/v/bin/sglang", "serve"), True),
    (("env", "A=1", "/v/bin/sglang", "serve"), True), ((), False), (("serve",), False),
    (("sglang-guard", "serve"), False), (("python", "-m", "sglang.launch_server"), False),
    (("sglang", "serve", "--tp"), False),
])
def test_is_serve_launch(launch: tuple[str, ...], serve: bool) -> None:
    assert is_serve_launch(launch) is serve


@pytest.mark.parametrize(("words", "head"), [
    (ARGS, ("python", "-m", "sglang.launch_server")),
    (("python3", "-u", "-m", "sglang.launch_server", *ARGS),
     ("python3", "-u", "-m", "sglang.launch_server")),
    (("CUDA_VISIBLE_DEVICES=0", "/opt/v/bin/python3", "-m", "sglang.launch_server", *ARGS),
     ("CUDA_VISIBLE_DEVICES=0", "/opt/v/bin/python3", "-m", "sglang.launch_server")),
    (("/usr/bin/sglang-guard-launch", *ARGS), ("/usr/bin/sglang-guard-launch",)),
    (("sglang", "serve", "/m", "--model-type", "llm", "--tp", "2"),
     ("sglang", "serve", "--model-type", "llm")),
    (("HF_HOME=/x", "sglang-guard", "serve", "--model-type=auto", "/m"),
     ("HF_HOME=/x", "sglang-guard", "serve", "--model-type=auto")),
])
def test_a_fixed_line_starts_as_the_checked_one_did(words: tuple[str, ...],
                                                    head: tuple[str, ...]) -> None:
    """`check`'s "command" line: the launcher the user gave, then the server arguments."""
    launch = read_launch(words)
    assert launch.head() == head
    # the fixed line reads back as the same launch with those server arguments
    own, server = launch.split()
    again = read_launch([*launch.head(), *server])
    assert again.split() == (own, server)
    assert again.head() == launch.head()
