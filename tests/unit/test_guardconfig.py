"""Guard config TOML: defaults, every section, and errors that name file, key and type."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_guard.config.guardconfig import GuardConfig, PolicyConfig, parse_guard_config
from sglang_guard.config.shell.configfile import locate, read_guard_config
from sglang_guard.errors import ConfigError

FULL = """
state = { dir = "/var/lib/g" }
gpu = { sm = 90 }
log = { format = "json" }

[sglang]
args = ["--model-path", "/m"]
config = "/etc/s.yaml"
launch = ["sglang", "serve"]
python = "/usr/bin/python3"

[policy]
default = "rewrite"
flags = { "--attention-backend" = "fail", "--decode-attention-backend" = "warn" }

[policy.rewrite]
"--attention-backend" = "triton"
"--prefill-attention-backend" = { flashmla = "fa3", "*" = "triton" }

[restart]
max_failures = 3
window_s = 60
backoff_initial_s = 0.5

[health]
enabled = false
host = "127.0.0.1"
liveness_failures = 5

[rules]
default_pack = false
packs = ["/etc/p.toml"]
"""


def test_empty_file_is_all_defaults() -> None:
    cfg = parse_guard_config("", "g.toml")
    assert cfg == GuardConfig(path="g.toml")
    assert cfg.policy.mode("--attention-backend") == "drop"


def test_full_file() -> None:
    cfg = parse_guard_config(FULL, "g.toml")
    assert cfg.state_dir == "/var/lib/g"
    assert cfg.gpu_sm == "90"
    assert cfg.log_format == "json"
    assert cfg.sglang.args == ("--model-path", "/m")
    assert cfg.sglang.launch == ("sglang", "serve")
    assert cfg.policy == PolicyConfig(
        "rewrite",
        {"--attention-backend": "fail", "--decode-attention-backend": "warn"},
        {"--attention-backend": {"*": "triton"},
         "--prefill-attention-backend": {"flashmla": "fa3", "*": "triton"}},
    )
    assert cfg.policy.mode("--attention-backend") == "fail"
    assert cfg.policy.mode("--prefill-attention-backend") == "rewrite"
    assert cfg.restart.max_failures == 3
    assert cfg.restart.window_s == 60.0
    assert isinstance(cfg.restart.window_s, float)
    assert cfg.restart.backoff_initial_s == 0.5
    assert cfg.health.enabled is False
    assert cfg.health.liveness_failures == 5
    assert cfg.rules.packs == ("/etc/p.toml",)


@pytest.mark.parametrize(
    ("text", "key", "needle"),
    [
        ("x = [", None, "not valid TOML"),
        ("polcy = {}", "polcy", "unknown key"),
        ("[restart]\nmax_failure = 1", "restart.max_failure", "unknown key"),
        ("[restart]\nmax_failures = '3'", "restart.max_failures", "expected int, got str"),
        ("[restart]\nmax_failures = 1.5", "restart.max_failures", "expected int, got float"),
        ("[restart]\nmax_failures = true", "restart.max_failures", "expected int, got bool"),
        ("[restart]\nwindow_s = true", "restart.window_s", "expected float, got bool"),
        ("[restart]\nwindow_s = -1", "restart.window_s", ">= 0"),
        ("[restart]\nwindow_s = nan", "restart.window_s", "finite"),
        ("[restart]\nstop_grace_s = inf", "restart.stop_grace_s", "finite"),
        ("[health]\nenabled = 1", "health.enabled", "expected bool, got int"),
        ("[health]\nhost = 1", "health.host", "expected str | None"),
        ("[sglang]\nargs = '--model-path /m'", "sglang.args", "expected tuple[str, ...]"),
        ("[sglang]\nargs = ['--tp', 2]", "sglang.args", "list of strings"),
        ("restart = 1", "restart", "expected a table"),
        ("[policy]\ndefault = 'skip'", "policy.default", "expected one of"),
        ("[policy]\nmode = 'drop'", "policy.mode", "unknown key"),
        ("[policy]\nflags = 1", "policy.flags", "expected a table"),
        ("[policy.flags]\n'--attention-backend' = 'nuke'", "policy.flags.--attention-backend",
         "expected one of"),
        ("[policy.flags]\nattention-backend = 'drop'", "policy.flags.attention-backend",
         "--attention-backend"),
        ("[policy.flags]\n'--atention-backend' = 'drop'", "policy.flags.--atention-backend",
         "not a flag the policy applies to"),
        ("[policy.rewrite]\n'--attention-backend' = 1", "policy.rewrite.--attention-backend",
         "expected a backend name"),
        ("[policy.rewrite]\n'--attention-backend' = { fa3 = 1 }",
         "policy.rewrite.--attention-backend", "expected a backend name"),
        ("[policy]\nrewrite = []", "policy.rewrite", "expected a table"),
        ("state = { dir = 1 }", "state.dir", "expected str"),
        ("state = { dri = '/x' }", "state.dri", "unknown key"),
        ("gpu = { sm = true }", "gpu.sm", "expected str or int"),
        ("gpu = { sm = 'hopper' }", "gpu.sm", "expected auto, none or an SM"),
        ("gpu = { model = 'h100' }", "gpu.model", "unknown key"),
        ("log = { format = 'xml' }", "log.format", "expected one of"),
        ("log = { level = 'info' }", "log.level", "unknown key"),
    ],
)
def test_errors_name_file_key_and_expectation(text: str, key: str | None, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_guard_config(text, "/etc/g.toml")
    err = info.value
    assert (err.path, err.key) == ("/etc/g.toml", key)
    assert needle in err.problem
    assert str(err).startswith(f"/etc/g.toml: {key}: " if key else "/etc/g.toml: ")
    assert "\n" not in str(err) or key is None


@pytest.mark.parametrize("sm", ["auto", "none", "90", "sm90", "9.0", "120", 100])
def test_gpu_sm_forms(sm: object) -> None:
    text = f"gpu = {{ sm = {sm!r} }}".replace("'", '"') if isinstance(sm, str) else \
        f"gpu = {{ sm = {sm} }}"
    assert parse_guard_config(text, "g.toml").gpu_sm == str(sm)


def test_read_guard_config_files(tmp_path: Path) -> None:
    assert read_guard_config(None) == GuardConfig()
    good = tmp_path / "g.toml"
    good.write_text("[policy]\ndefault = 'fail'\n", encoding="utf-8")
    assert read_guard_config(str(good)).policy.default == "fail"
    with pytest.raises(ConfigError, match="file not found"):
        read_guard_config(str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="is a directory"):
        read_guard_config(str(tmp_path))
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="cannot read it"):
        read_guard_config(str(bad))


def test_locate_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert locate(None, search_defaults=False) is None
    user = tmp_path / "config" / "sglang-guard" / "guard.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert locate(None, search_defaults=True) in (None, "/etc/sglang-guard/guard.toml")
    user.parent.mkdir(parents=True)
    user.write_text("", encoding="utf-8")
    if not Path("/etc/sglang-guard/guard.toml").is_file():
        assert locate(None, search_defaults=True) == str(user)
    monkeypatch.setenv("SGLANG_GUARD_CONFIG", "/env.toml")
    assert locate(None, search_defaults=True) == "/env.toml"
    assert locate("/explicit.toml", search_defaults=True) == "/explicit.toml"


def test_group_section_defaults_and_checks() -> None:
    group = parse_guard_config("", "g.toml").group
    assert (group.port, group.bind, group.leader_lost_s) == (0, "auto", 30.0)  # 0: derived
    assert (group.secret_file, group.insecure) == ("", False)
    cfg = parse_guard_config('[group]\nport = 7000\nbind = "10.0.0.5"\nleader_lost_s = 5\n', "g")
    assert (cfg.group.port, cfg.group.bind, cfg.group.leader_lost_s) == (7000, "10.0.0.5", 5.0)
    with pytest.raises(ConfigError, match=r"group.port: expected a TCP port"):
        parse_guard_config("[group]\nport = 70000\n", "g.toml")
    with pytest.raises(ConfigError, match=r"group.heartbeat_s: must be above 0"):
        parse_guard_config("[group]\nheartbeat_s = 0\n", "g.toml")
    with pytest.raises(ConfigError, match=r"group.*leader"):
        parse_guard_config("[group]\nleader = 1\n", "g.toml")


def test_learn_is_off_unless_a_store_is_named() -> None:
    assert not parse_guard_config("", "g.toml").learn.enabled
    learn = parse_guard_config('[learn]\nstore = "etcd://10.0.0.1:2379,10.0.0.2:2379/fleet"\n'
                               'user = "guard"\npassword_file = "/run/secrets/etcd"\n'
                               "ttl_days = 7\npublish = false\n", "g.toml").learn
    assert learn.enabled and learn.ttl_days == 7.0 and not learn.publish and learn.consume
    assert learn.timeout_s == 2.0


@pytest.mark.parametrize(("text", "key", "needle"), [
    ('store = "redis://x"', "learn.store", "expected file://"),
    ('store = "file://rel"', "learn.store", "absolute"),
    ('store = "etcd://u:p@h:2379/x"', "learn.store", "credentials go in"),
    ('store = "file:///x"\nttl_days = 0', "learn.ttl_days", "above 0"),
    ('store = "file:///x"\ntimeout_s = 5', "learn.timeout_s", "at most 2"),
    ('store = "file:///x"\npassword_file = "/p"', "learn.password_file", "needs user"),
    ('store = "file:///x"\nkey_file = "/k"', "learn.key_file", "needs cert_file"),
    ('store = "file:///x"\npassword = "inline"', "learn.password", "unknown"),
    ('store = "etcd://h:2379/x"', "learn.store", "writers must be authenticated"),
])
def test_learn_errors_name_the_key(text: str, key: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_guard_config(f"[learn]\n{text}\n", "g.toml")
    assert key in str(info.value) and needle in str(info.value)
