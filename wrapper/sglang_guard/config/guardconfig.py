"""The guard's own config file (TOML): parsed and validated once, into frozen values.

Every error names the file, the key and what was expected. Unknown keys are errors too: a
typo in a policy key must not silently fall back to the default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import field, fields, replace
from typing import Any, Literal, cast, get_args

from sglang_guard.common.record import record
from sglang_guard.config.tomlread import Table
from sglang_guard.errors import InputError
from sglang_guard.sglang.options import BACKEND_FLAGS

PolicyMode = Literal["drop", "rewrite", "fail", "warn"]
POLICY_MODES: tuple[str, ...] = get_args(PolicyMode)
LogFormat = Literal["auto", "json", "console"]


@record
class PolicyConfig:
    """What to do with a flag that does not fit: per-flag overrides over a default."""

    default: PolicyMode = "drop"
    flags: Mapping[str, PolicyMode] = field(default_factory=dict)
    # flag -> {bad value or "*" -> replacement}: the explicit map `rewrite` uses first.
    rewrite: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def mode(self, flag: str) -> PolicyMode:
        """The policy for `flag` (its override, else the default)."""
        return self.flags.get(flag, self.default)


@record
class SglangSection:
    """The SGLang command the guard runs when none is given on its command line."""

    args: tuple[str, ...] = ()
    config: str | None = None  # an SGLang YAML: becomes `--config PATH`
    # e.g. ("sglang", "serve"); default: <python> -m sglang.launch_server
    launch: tuple[str, ...] = ()
    python: str | None = None
    # The SGLang release that runs, for a `launch` command the guard cannot read it from.
    version: str | None = None


@record
class RestartSection:
    """Crash-loop limits and backoff."""

    max_failures: int = 5  # give up after this many failures ...
    window_s: float = 600.0  # ... within this many seconds
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_factor: float = 2.0
    stable_after_s: float = 300.0  # a run this long resets the backoff
    stop_grace_s: float = 20.0  # SIGTERM -> SIGKILL
    ready_timeout_s: float = 3600.0  # no readiness within this: restart
    # Two launches of the same command line that end with the same exception line (numbers
    # and addresses masked): nothing a third launch can change, give up (issue 19 item 6).
    give_up_on_repeat: bool = True


@record
class HealthSection:
    """Readiness and liveness probing of SGLang's HTTP server."""

    enabled: bool = True
    host: str | None = None  # default: SGLang's --host (0.0.0.0 probed as 127.0.0.1)
    timeout_s: float = 30.0  # SGLang's /health_generate itself may take up to 20 s
    liveness_interval_s: float = 30.0
    liveness_failures: int = 3  # this many failed /health_generate in a row restart SGLang


ON_STALL = ("restart", "give_up")


@record
class StartSection:
    """Start-up progress watching: per stage, the longest time without progress (0: off).

    Progress is a line of SGLang's own log format or a redrawn progress bar; the stages are
    those of rules/stages.py. Generous defaults: a big model on a slow disk is not a hang.
    """

    init_s: float = 900.0  # imports, argument resolution, between the stages below
    dist_init_s: float = 900.0  # "Init parallel begin." until its end (peers, NCCL, gloo)
    weights_s: float = 1800.0  # "Load weight begin." until its end (bars count)
    cuda_graph_s: float = 1200.0  # "Capture ... graph begin." until its end
    warmup_s: float = 900.0  # "Uvicorn running on" until "ready to roll"
    on_stall: str = "restart"  # restart (counts as a failure) | give_up (exit 75)

    def limit(self, stage: str) -> float:
        """The limit for `stage` (a name from rules/stages.STAGES)."""
        return float(getattr(self, f"{stage}_s"))


@record
class RulesSection:
    """Which rule packs the supervisor matches log lines against."""

    default_pack: bool = True
    packs: tuple[str, ...] = ()
    # Deny-listed flags (rules/packcheck.py) that this config lets rules change anyway.
    allow_set: tuple[str, ...] = ()


# The leader guard's group port: next to the status port (9488), away from SGLang's 30000+.
DEFAULT_GROUP_PORT = 9489
# Several guards on one host (systemd template instances, several groups) each get their own
# ports without configuration: a default port moves by 2 x (the instance's port mod 500),
# the status port from SGLang's --port, the group port from --dist-init-addr's port (which
# every node of a group shares). Status ports stay even, group ports odd: never each other.
PORT_SPREAD = 500


def derived_port(base: int, instance_port: int | None) -> int:
    """`base` moved for the instance that `instance_port` names (None: `base` itself)."""
    return base if instance_port is None else base + 2 * (instance_port % PORT_SPREAD)


@record
class GroupSection:
    """A multi-node group's guards (docs/multinode.md): the leader's port, the silence bounds."""

    # The leader serves here; workers reach it at the leader host. 0 (the default): 9489 moved
    # by --dist-init-addr's port (`derived_port`); LWS without --dist-init-addr: 9489.
    port: int = 0
    # The leader's bind address; "auto": the leader host the workers dial (--dist-init-addr's
    # host or LWS_LEADER_ADDRESS: the pod's own address), never every address (0.0.0.0).
    bind: str = "auto"
    # The group's shared secret (a Kubernetes Secret mounted in every pod): every message
    # between the guards is authenticated with it (group/groupauth.py). Without one a
    # multi-node guard refuses to start unless `insecure = true`.
    secret_file: str = ""
    insecure: bool = False  # run a group with no authentication (a trusted, isolated network)
    heartbeat_s: float = 1.0  # how often a worker reports to the leader
    leader_lost_s: float = 30.0  # a worker whose leader is silent this long stops and exits 76
    worker_lost_s: float = 30.0  # a worker silent this long is a failure of the group
    join_timeout_s: float = 600.0  # every worker must run the leader's launch within this


LEARN_SCHEMES = ("file://", "etcd://", "etcds://")
LEARN_TIMEOUT_MAX_S = 2.0  # a store may delay a start by this much, never more


@record
class LearnSection:
    """Fleet memory (fleet/shell/fleet.py): a store the fleet's guards share fixes through; off
    unless `store` is set. Credentials come from files, never from this file itself."""

    store: str = ""  # file:///DIR, etcd://HOST:PORT[,HOST:PORT]/PREFIX, etcds://... (TLS)
    publish: bool = True  # write what this guard learned (proven or known-bad)
    consume: bool = True  # apply a proven entry before the first launch
    ttl_days: float = 30.0
    timeout_s: float = LEARN_TIMEOUT_MAX_S  # per store request
    user: str | None = None  # etcd user (auth enabled)
    password_file: str | None = None  # its password, in a file of its own
    ca_file: str | None = None  # etcds://: the CA that signed the server's certificate
    cert_file: str | None = None  # etcds://: a client certificate (and its key) as identity
    key_file: str | None = None
    guard_id: str | None = None  # how this guard names itself in entries (default: host)
    # etcd without user or client certificate: anyone who reaches etcd could write a fix
    # every guard applies; only with this set (a test cluster, a private network).
    allow_unauthenticated: bool = False

    @property
    def enabled(self) -> bool:
        """A store is configured."""
        return bool(self.store)


# The guard's own HTTP port (/metrics, /livez, /readyz, /startupz, /status): SGLang's default
# is 30000 and its internal ports land above it, so the guard's sits well away from both.
DEFAULT_STATUS_PORT = 9488
# "auto": 127.0.0.1 on 9488 moved by SGLang's --port (`derived_port`: 30000 gives 9488); when
# that port is taken, any free one. The port is announced (the journal's status.listening,
# `status-address` in the state dir, systemd's STATUS=).
AUTO = "auto"
DEFAULT_STATUS_LISTEN = AUTO
TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
_LISTEN = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\s:\[\]]*)):(?P<port>\d{1,5})$")
_OFF = ("", "off")


@record
class StatusSection:
    """The guard's own HTTP port: metrics and probes, up before preflight."""

    listen: str = DEFAULT_STATUS_LISTEN  # HOST:PORT, [V6]:PORT, or "off"
    allow_remote: bool = False  # a HOST other than loopback needs this set
    termination_log: str = TERMINATION_LOG  # "" turns it off

    def address(self, sglang_port: int | None = None) -> tuple[str, int] | None:
        """(host, port) to bind, None when off; `listen` was validated on the way in."""
        if self.auto:
            return "127.0.0.1", derived_port(DEFAULT_STATUS_PORT, sglang_port)
        return parse_listen(self.listen, allow_remote=True)

    @property
    def auto(self) -> bool:
        """The default: a port derived from the instance, any free one when that is taken."""
        return self.listen.strip().lower() == AUTO


def parse_listen(text: str, *, allow_remote: bool) -> tuple[str, int] | None:
    """`HOST:PORT` as (host, port), None for "off"; ValueError says what is wrong."""
    if text.strip().lower() in _OFF:
        return None
    if text.strip().lower() == AUTO:
        return "127.0.0.1", DEFAULT_STATUS_PORT
    m = _LISTEN.match(text.strip())
    if m is None or not 0 <= int(m["port"]) < 65536:  # 0: any free port (it is logged)
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:{DEFAULT_STATUS_PORT}), \"auto\" "
                         f"or \"off\", got {text!r}")
    host = m["v6"] or m["host"] or "0.0.0.0"  # noqa: S104 - ":9488" means every address
    if not allow_remote and not _loopback(host):
        raise ValueError(f"{host} is not a loopback address: the status port shows the "
                         "command line and counts to anyone who can reach it; set "
                         "status.allow_remote = true to bind it")
    return host, int(m["port"])


def _loopback(host: str) -> bool:
    return host in {"localhost", "::1"} or host.startswith("127.")


@record
class GuardConfig:
    """The whole guard config; every section has defaults, so an empty file is valid."""

    path: str | None = None
    sglang: SglangSection = field(default_factory=SglangSection)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    restart: RestartSection = field(default_factory=RestartSection)
    health: HealthSection = field(default_factory=HealthSection)
    rules: RulesSection = field(default_factory=RulesSection)
    group: GroupSection = field(default_factory=GroupSection)
    start: StartSection = field(default_factory=StartSection)
    status: StatusSection = field(default_factory=StatusSection)
    learn: LearnSection = field(default_factory=LearnSection)
    state_dir: str | None = None
    gpu_sm: str = "auto"
    log_format: LogFormat = "auto"

    def sglang_argv(self) -> tuple[str, ...]:
        """The SGLang arguments this config gives: `--config <[sglang] config>`, then `args`."""
        head = ("--config", self.sglang.config) if self.sglang.config else ()
        return (*head, *self.sglang.args)


def with_overrides(cfg: GuardConfig, policy: str | None, gpu_sm: str | None,
                   *, policy_source: str = "--policy") -> GuardConfig:
    """--policy / --gpu-sm (or their SGLANG_GUARD_* twins) over what the config file says."""
    if policy:
        if policy not in POLICY_MODES:
            raise InputError(f"{policy_source}={policy!r}: expected one of "
                             f"{', '.join(POLICY_MODES)}")
        cfg = replace(cfg, policy=replace(cfg.policy, default=cast("PolicyMode", policy)))
    if gpu_sm:
        cfg = replace(cfg, gpu_sm=gpu_sm)
    return cfg


def parse_guard_config(text: str, path: str) -> GuardConfig:
    """Parse and validate the TOML text of a guard config."""
    root = Table.parse(text, path)
    root.known({"sglang", "policy", "restart", "health", "rules", "group", "start", "state",
                "gpu", "log", "status", "learn"})
    return GuardConfig(
        path=path,
        sglang=_section(root.table("sglang"), SglangSection),
        policy=_policy(root.table("policy")),
        restart=_section(root.table("restart"), RestartSection),
        health=_section(root.table("health"), HealthSection),
        rules=_section(root.table("rules"), RulesSection),
        group=_group(root.table("group")),
        start=_start(root.table("start")),
        status=_status(root.table("status")),
        learn=_learn(root.table("learn")),
        state_dir=_leaf(root, "state", "dir").text("dir"),
        gpu_sm=_gpu_sm(_leaf(root, "gpu", "sm")),
        log_format=cast("LogFormat", _leaf(root, "log", "format").choice(
            "format", ("auto", "json", "console"), "auto")),
    )


def _group(raw: Table) -> GroupSection:
    group: GroupSection = _section(raw, GroupSection)
    if not 0 <= group.port < 65536:
        raise raw.fail("port", f"expected a TCP port (1-65535, 0: derived), got {group.port}")
    if group.heartbeat_s <= 0:
        raise raw.fail("heartbeat_s", "must be above 0")
    return group
def _start(table: Table) -> StartSection:
    section: StartSection = _section(table, StartSection)
    table.choice("on_stall", ON_STALL, "restart")
    return section


def _status(raw: Table) -> StatusSection:
    status: StatusSection = _section(raw, StatusSection)
    try:
        parse_listen(status.listen, allow_remote=status.allow_remote)
    except ValueError as exc:
        raise raw.fail("listen", str(exc)) from None
    return status


def _learn(raw: Table) -> LearnSection:
    learn: LearnSection = _section(raw, LearnSection)
    if learn.store and not learn.store.startswith(LEARN_SCHEMES):
        raise raw.fail("store", f"expected {', '.join(s + '...' for s in LEARN_SCHEMES)}, "
                                f"got {learn.store!r}")
    if learn.store.startswith("file://") and not learn.store[7:].startswith("/"):
        raise raw.fail("store", "file:// needs an absolute directory, e.g. file:///var/lib/x")
    if "@" in learn.store.partition("//")[2].partition("/")[0]:
        raise raw.fail("store", "credentials go in user / password_file, not in the address")
    if learn.ttl_days <= 0:
        raise raw.fail("ttl_days", "must be above 0")
    if not 0 < learn.timeout_s <= LEARN_TIMEOUT_MAX_S:
        raise raw.fail("timeout_s", f"must be above 0 and at most {LEARN_TIMEOUT_MAX_S:g}")
    if learn.store.startswith(("etcd://", "etcds://")) and not learn.user \
            and not learn.cert_file and not learn.allow_unauthenticated:
        raise raw.fail("store", "an etcd store needs user + password_file or cert_file "
                                "(the writers must be authenticated), or "
                                "allow_unauthenticated = true")
    if learn.password_file and not learn.user:
        raise raw.fail("password_file", "needs user")
    if learn.key_file and not learn.cert_file:
        raise raw.fail("key_file", "needs cert_file")
    return learn


def _leaf(root: Table, name: str, key: str) -> Table:
    """A one-key section such as [gpu] (any other key is unknown)."""
    table = root.table(name)
    table.known({key})
    return table


# What `--gpu-sm` accepts (preflight/shell/gpuprobe.parse_gpu_sm does the range check).
_GPU_SM = re.compile(r"^(auto|none|(sm)?\d{2,3}|\d+\.\d)$", re.IGNORECASE)


def _gpu_sm(table: Table) -> str:
    text = str(table.get("sm", (str, int), "auto"))
    if not _GPU_SM.match(text.strip()):
        raise table.fail("sm", f"expected auto, none or an SM such as 90, got {text!r}")
    return text


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "bool": (bool,), "str | None": (str, type(None)),
    "tuple[str, ...]": (list,), "str": (str,),
}


def _section(raw: Table, cls: type[Any]) -> Any:
    spec = {f.name: f for f in fields(cls)}
    raw.known(spec)
    values: dict[str, Any] = {}
    for key in raw.data:
        kind = str(spec[key].type)
        value: Any = raw.get(key, _TYPES.get(kind, (object,)), name=kind)
        if kind == "tuple[str, ...]":
            if not all(isinstance(v, str) for v in value):
                raise raw.fail(key, "expected a list of strings")
            value = tuple(value)
        # TOML has nan and inf; neither is a usable count, delay or timeout.
        if kind in ("int", "float") and (value < 0 or not math.isfinite(value)):
            raise raw.fail(key, f"must be a finite number >= 0, got {value}")
        values[key] = float(value) if kind == "float" else value
    return cls(**values)


def _policy(raw: Table) -> PolicyConfig:
    raw.known({"default", "flags", "rewrite"})
    default = cast("PolicyMode", raw.choice("default", POLICY_MODES, "drop"))
    flags = raw.table("flags")
    for flag in flags.data:
        _flag_name(flags, flag)
        flags.choice(flag, POLICY_MODES)
    rewrite: dict[str, dict[str, str]] = {}
    table = raw.table("rewrite")
    for flag, target in table.data.items():
        _flag_name(table, flag)
        if isinstance(target, str):
            rewrite[flag] = {"*": target}
        elif isinstance(target, dict) and all(isinstance(v, str) for v in target.values()):
            rewrite[flag] = dict(target)
        else:
            raise table.fail(flag, "expected a backend name or a table of bad value -> backend")
    return PolicyConfig(default, dict(flags.data), rewrite)


def _flag_name(table: Table, flag: str) -> None:
    if not flag.startswith("--"):
        raise table.fail(flag, f"flags are written as SGLang spells them, e.g. --{flag}")
    # Preflight applies the policy to these flags only; any other name is a typo.
    if flag not in BACKEND_FLAGS:
        raise table.fail(flag, f"not a flag the policy applies to "
                               f"(one of: {', '.join(BACKEND_FLAGS)})")
