"""A multi-node SGLang group, decided without I/O: who leads, what every node must agree on,
who is missing, and what a worker does with the leader's answers.

The leader (rank 0's guard) keeps a `Roster`; every worker keeps a `Follower`. The shell
(`group/shell/group.py`) carries the messages over HTTP and turns these decisions into events on
the supervision loop's queue; the leader's own state machine makes every fix and restart
decision for the whole group (`supervise/machine.py`, events `PeerLine` and `PeerDown`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, field, replace
from typing import Any

from sglang_guard.common.outcomes import GiveUpCause
from sglang_guard.common.record import record
from sglang_guard.common.sha import sha256
from sglang_guard.config.guardconfig import DEFAULT_GROUP_PORT, derived_port
from sglang_guard.errors import EXIT_LEADER_LOST, InputError
from sglang_guard.sglang.argv import CONFIG_FLAG, CommandLine, parse_command_line
from sglang_guard.sglang.edits import Edit, apply_edits, derived_path_for
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.redact import MASK, is_secret_dest
from sglang_guard.supervise.events import Event, GroupExit, GroupReady, GroupRelaunch

# Options that differ between the nodes of one group by nature: the rank, and the HTTP
# server that only rank 0 runs (with --dist-init-addr, SGLang derives its internal ports
# from the dist-init port, not from --port).
PER_NODE = frozenset({"node_rank", "host", "port"})


@record
class GroupSpec:
    """This node's place in a multi-node group."""

    nnodes: int
    rank: int
    leader: str  # the host where the workers reach the leader's guard
    port: int  # the leader guard's group port

    @property
    def leads(self) -> bool:
        """Rank 0's guard leads the group."""
        return self.rank == 0


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(f"{what}={text!r}: expected a whole number") from None


def _host_of(addr: str) -> str:
    """The host of `HOST:PORT` or `[V6]:PORT` (SGLang's --dist-init-addr)."""
    addr = addr.strip()
    if addr.startswith("["):
        return addr[1:addr.find("]")] if "]" in addr else addr[1:]
    return addr.rsplit(":", 1)[0] if ":" in addr else addr


def _pick(flag: str | None, env: str | None, flag_name: str, env_name: str) -> str | None:
    if flag is not None and env is not None and flag.strip() != env.strip():
        raise InputError(f"{flag_name} {flag} but {env_name}={env}: the node's place in the "
                         "group is ambiguous")
    return flag if flag is not None else env


def _port_of(addr: str) -> int | None:
    """The port of `HOST:PORT` or `[V6]:PORT` (None: none, or not a number)."""
    tail = addr.strip().rsplit("]", 1)[-1] if addr.strip().startswith("[") else addr.strip()
    if ":" not in tail:
        return None
    text = tail.rsplit(":", 1)[1]
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 5 else None


def group_spec(cl: CommandLine, environ: Mapping[str, str], port: int) -> GroupSpec | None:
    """The group this command line belongs to (SGLang's flags, else LWS's env); None: one node.

    `port` 0: the default group port moved by --dist-init-addr's port (the same on every node
    of the group, and another for each group a host runs), 9489 without it.
    """
    nnodes_text = _pick(cl.value("nnodes"), environ.get("LWS_GROUP_SIZE"),
                        "--nnodes", "LWS_GROUP_SIZE")
    nnodes = _int(nnodes_text, "--nnodes") if nnodes_text else 1
    if nnodes <= 1:
        return None
    rank_text = _pick(cl.value("node_rank"), environ.get("LWS_WORKER_INDEX"),
                      "--node-rank", "LWS_WORKER_INDEX")
    rank = _int(rank_text, "--node-rank") if rank_text else 0
    if not 0 <= rank < nnodes:
        raise InputError(f"--node-rank {rank} is outside the group (--nnodes {nnodes})")
    addr = cl.value("dist_init_addr")
    leader = _host_of(addr) if addr else environ.get("LWS_LEADER_ADDRESS", "").strip()
    if port == 0:
        port = derived_port(DEFAULT_GROUP_PORT, _port_of(addr) if addr else None)
    if not leader:
        raise InputError(f"--nnodes {nnodes} needs --dist-init-addr HOST:PORT (or "
                         "LWS_LEADER_ADDRESS) so the guards can find the leader")
    return GroupSpec(nnodes, rank, leader, port)


# -- the inputs every node must share -------------------------------------------------------


@record
class Digest:
    """What a node would launch from: equal digests give equal decisions (preflight is pure)."""

    flags: Mapping[str, str | None]  # effective flags, per-node ones left out, secrets hashed
    model_config: str | None  # sha256 of config.json (None: could not be read)
    sglang: str | None
    gpu_sm: int | None
    gpu_count: int | None
    # sha256 of the rule packs as loaded: a worker's own rules decide which lines it reports
    rules: str | None = None
    policy: str | None = None  # sha256 of the guard policy (and [rules] allow_set)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {**asdict(self), "flags": dict(self.flags)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Digest:
        """The digest a peer sent (ValueError when malformed)."""
        try:
            flags = {str(k): None if v is None else str(v) for k, v in data["flags"].items()}
            return cls(flags, data.get("model_config"), data.get("sglang"),
                       data.get("gpu_sm"), data.get("gpu_count"), data.get("rules"),
                       data.get("policy"))
        except (KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"malformed digest: {exc}") from None


def _short(value: str, key: bytes | None) -> str:
    if key is None:
        return "sha256:" + sha256(value.encode()).hexdigest()[:12]
    # keyed with the group secret: whoever sees a join cannot try guesses of the value (a
    # keyed group runs group/shell/group*, which load the hmac module anyway)
    from sglang_guard.group.groupauth import hmac_hex  # noqa: PLC0415

    return "hmac:" + hmac_hex(key, value.encode())[:24]


def node_flags(cl: CommandLine, key: bytes | None = None) -> dict[str, str | None]:
    """The effective flags without the per-node ones and `--config` itself (its content counts)."""
    out: dict[str, str | None] = {}
    for occ in cl.occurrences:
        spec = occ.spec
        if spec is None or spec.dest in PER_NODE or spec.canonical == CONFIG_FLAG:
            continue
        value = occ.value
        if value is not None and is_secret_dest(spec.dest):
            value = _short(value, key)
        out[spec.canonical] = value
    return out


def make_digest(cl: CommandLine, model_config: str | None, sglang: str | None,
                gpu_sm: int | None, gpu_count: int | None, *, rules: str | None = None,
                policy: str | None = None, key: bytes | None = None) -> Digest:
    """This node's digest (`key`: the group secret, which keys the hashes of secret values)."""
    return Digest(node_flags(cl, key), model_config, sglang, gpu_sm, gpu_count, rules, policy)


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    return str(value)[:12] if isinstance(value, str) and len(value) == 64 else str(value)


def differences(leader: Digest, node: Digest) -> list[str]:
    """What differs on `node` from the leader, one phrase each (empty: the same inputs)."""
    out: list[str] = []
    for flag in sorted(set(leader.flags) | set(node.flags)):
        here, there = node.flags.get(flag, "<absent>"), leader.flags.get(flag, "<absent>")
        if here != there and is_secret_dest(flag.lstrip("-").replace("-", "_")):
            out.append(f"{flag}: differs from the leader's (a secret: no value is shown)")
        elif here != there:
            out.append(f"{flag}: {_shown(here)} here, {_shown(there)} on the leader")
    for name, what in (("model_config", "the model's config.json (sha256)"),
                       ("sglang", "the SGLang release"), ("gpu_sm", "the GPU SM"),
                       ("gpu_count", "the GPU count"),
                       ("rules", "the rule packs (sha256)"),
                       ("policy", "the guard policy (sha256)")):
        here, there = getattr(node, name), getattr(leader, name)
        if here != there:
            out.append(f"{what}: {_shown(here)} here, {_shown(there)} on the leader")
    return out


# -- the leader's book of its workers -------------------------------------------------------


@record
class Member:
    """A worker as the leader last heard of it."""

    gen: int  # the group generation it runs (0: none yet)
    seen: float
    phase: str = "joined"


@record
class Roster:
    """The leader's view of the group."""

    nnodes: int
    digest: Digest
    gen: int = 0  # the group generation: the leader's launch number
    launched_at: float = 0.0
    members: Mapping[int, Member] = field(default_factory=dict)
    reported: frozenset[tuple[int, int]] = frozenset()  # (gen, rank) already reported down
    ready: bool = False
    exit: tuple[int, str] | None = None  # the leader ended: workers end the same way
    exit_cause: GiveUpCause = GiveUpCause.OTHER  # ... and the leader's give-up cause, if any


def join(roster: Roster, rank: int, digest: Digest, now: float) -> tuple[Roster, list[str]]:
    """A worker asks to join; what keeps it out (empty: accepted)."""
    if not 0 < rank < roster.nnodes:
        return roster, [f"--node-rank {rank} is not a worker rank of this group "
                        f"(--nnodes {roster.nnodes} on the leader)"]
    problems = differences(roster.digest, digest)
    if problems:
        return roster, problems
    return replace(roster, members={**roster.members, rank: Member(0, now)}), []


def beat(roster: Roster, rank: int, gen: int, phase: str, now: float) -> Roster:
    """A worker's heartbeat (ranks that never joined are ignored)."""
    if rank not in roster.members:
        return roster
    return replace(roster, members={**roster.members, rank: Member(gen, now, phase)})


def launched(roster: Roster, gen: int, now: float) -> Roster:
    """The leader launched generation `gen` of the group."""
    return replace(roster, gen=gen, launched_at=now, ready=False)


# SGLang's ranks meet in torch.distributed's init first: with a node missing, rank 0 waits
# there with no progress line (sglang-versions.md: seen for over a minute on CPU).
DIST_INIT = "distributed init"


def overdue(roster: Roster, now: float, lost_s: float, join_s: float
            ) -> tuple[Roster, list[tuple[int, str, str | None]]]:
    """Workers newly missing from the current generation, each (rank, why, stage) once."""
    if roster.gen == 0 or roster.exit is not None:
        return roster, []
    down: list[tuple[int, str, str | None]] = []
    for rank in range(1, roster.nnodes):
        if (roster.gen, rank) in roster.reported:
            continue
        m = roster.members.get(rank)
        if m is not None and now - m.seen > lost_s:
            down.append((rank, f"node {rank}'s guard has not been heard from for {lost_s:g}s",
                         None))
        elif (m is None or m.gen != roster.gen) and now - roster.launched_at > join_s:
            down.append((rank, f"node {rank} did not come up in generation {roster.gen} "
                               f"within {join_s:g}s (group.join_timeout_s)",
                         DIST_INIT if m is None else None))
    reported = roster.reported | {(roster.gen, rank) for rank, _, _ in down}
    # A silent guard is out of the group: it joins again (if it comes back) to be counted.
    members = {r: m for r, m in roster.members.items() if now - m.seen <= lost_s}
    return replace(roster, reported=reported, members=members), down


def mark_reported(roster: Roster, gen: int, rank: int) -> Roster:
    """A worker's failure at `gen` was passed on: `overdue` says nothing more of it."""
    return replace(roster, reported=roster.reported | {(gen, rank)})


# -- a worker following its leader ----------------------------------------------------------


@record
class Launch:
    """What the leader launched: its command line, its YAML, where it names derived files."""

    argv: tuple[str, ...]
    yaml_data: Mapping[str, Any] | None
    derived_dir: str

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {"argv": list(self.argv), "yaml_data": self.yaml_data,
                "derived_dir": self.derived_dir}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Launch:
        """The launch the leader sent (ValueError when malformed)."""
        argv, yaml_data = data.get("argv"), data.get("yaml_data")
        if not isinstance(argv, list) or not all(isinstance(t, str) for t in argv):
            raise ValueError("malformed launch: argv")
        if yaml_data is not None and not isinstance(yaml_data, dict):
            raise ValueError("malformed launch: yaml_data")
        return cls(tuple(argv), yaml_data, str(data.get("derived_dir", "")))


def masked_launch(cl: CommandLine, derived_dir: str) -> Launch:
    """What the leader publishes of `cl`: every secret option's value replaced by MASK.

    HMAC authenticates the group's messages but does not hide them, so an API key never
    travels; each worker puts back its own value (`worker_command_line`), which its join
    digest proved equal to the leader's.
    """
    argv = list(cl.argv)
    yaml_data = dict(cl.yaml_data) if cl.yaml_data is not None else None
    for occ in cl.occurrences:
        if occ.spec is None or not is_secret_dest(occ.spec.dest) or not occ.values:
            continue
        if occ.origin == "yaml" and yaml_data is not None and occ.yaml_key is not None:
            yaml_data[occ.yaml_key] = MASK
        elif occ.inline:
            argv[occ.index] = f"{occ.option}={MASK}"
        else:
            for at in range(occ.index + 1, occ.index + occ.count):
                argv[at] = MASK
    return Launch(tuple(argv), yaml_data, derived_dir)


def _unmasked(cl: CommandLine, own: CommandLine) -> tuple[list[str], dict[str, Any] | None]:
    """`cl` (a masked launch) with this node's own values of its secret options."""
    argv = list(cl.argv)
    yaml_data = dict(cl.yaml_data) if cl.yaml_data is not None else None
    for occ in cl.occurrences:
        if occ.spec is None or not is_secret_dest(occ.spec.dest) or MASK not in occ.values:
            continue
        mine = own.last(occ.spec.dest)
        if mine is None or not mine.values:
            raise ValueError(f"the leader runs {occ.spec.canonical}, this node has no value "
                             "for it")
        if occ.origin == "yaml" and yaml_data is not None and occ.yaml_key is not None:
            raw = (own.yaml_data or {}).get(mine.yaml_key or "") if mine.origin == "yaml" \
                else None
            yaml_data[occ.yaml_key] = raw if raw is not None else mine.value
        elif occ.inline:
            argv[occ.index] = f"{occ.option}={mine.value}"
        elif occ.count - 1 == len(mine.values):
            argv[occ.index + 1:occ.index + occ.count] = list(mine.values)
        else:
            raise ValueError(f"{occ.spec.canonical}: the leader's and this node's values differ "
                             "in shape")
    return argv, yaml_data


def unmask(launch: Launch, options: OptionTable, own: CommandLine) -> CommandLine:
    """A masked launch (`masked_launch`) with `own`'s values of its secret options."""
    argv, yaml_data = _unmasked(parse_command_line(launch.argv, options, launch.yaml_data), own)
    return parse_command_line(tuple(argv), options, yaml_data)


def worker_command_line(launch: Launch, rank: int, options: OptionTable, derived_dir: str,
                        own: CommandLine | None = None) -> CommandLine:
    """The leader's command line with this node's rank (and its own derived-file directory),
    and, in place of each masked secret, this node's own value (`own`: its command line)."""
    argv = list(launch.argv)
    yaml_data = launch.yaml_data
    if own is not None:
        argv, yaml_data = _unmasked(parse_command_line(tuple(argv), options, yaml_data), own)
    if yaml_data is not None and CONFIG_FLAG in argv:
        at = argv.index(CONFIG_FLAG) + 1
        leader_dir = launch.derived_dir.rstrip("/")
        if at < len(argv) and leader_dir and argv[at].startswith(leader_dir + "/"):
            argv[at] = derived_path_for(yaml_data, derived_dir)
    cl = parse_command_line(tuple(argv), options, yaml_data)
    result = apply_edits(cl, options, [Edit("node_rank", "set", str(rank))], derived_dir)
    yaml_data = result.derived_yaml if result.derived_yaml is not None else cl.yaml_data
    return parse_command_line(result.argv, options, yaml_data)


@record
class Reply:
    """The leader's answer to a heartbeat."""

    gen: int
    launch: Launch | None
    ready: bool
    exit: tuple[int, str] | None
    cause: Mapping[str, Any] | None  # the leader's decision that started `gen`, if any
    exit_cause: GiveUpCause = GiveUpCause.OTHER  # why the leader gave up (with `exit`)


@record
class Follower:
    """A worker's memory of its leader."""

    rank: int
    gen: int  # the group generation this node runs
    last_ok: float  # when the leader last answered
    lost_s: float  # no answer for this long: the leader is lost
    derived_dir: str
    done: bool = False


def follow(f: Follower, reply: Reply | None, now: float, options: OptionTable,
           own: CommandLine | None = None) -> tuple[Follower, list[Event]]:
    """One heartbeat's outcome (`reply` None: the leader did not answer) as loop events
    (`own`: this node's command line, whose secrets fill the leader's masked ones)."""
    if f.done:
        return f, []
    if reply is None:
        if now - f.last_ok <= f.lost_s:
            return f, []
        why = f"the group leader has not answered for {f.lost_s:g}s (group.leader_lost_s)"
        return replace(f, done=True), [GroupExit(EXIT_LEADER_LOST, why,
                                                 GiveUpCause.LEADER_LOST)]
    f = replace(f, last_ok=now)
    if reply.exit is not None:
        code, reason = reply.exit
        return replace(f, done=True), [GroupExit(code, f"the group leader exited: {reason}",
                                                 reply.exit_cause)]
    events: list[Event] = []
    if reply.gen > f.gen and reply.launch is not None:
        cl = worker_command_line(reply.launch, f.rank, options, f.derived_dir, own)
        events.append(GroupRelaunch(reply.gen, cl, dict(reply.cause or {})))
        f = replace(f, gen=reply.gen)
    if reply.ready and reply.gen == f.gen:
        events.append(GroupReady(f.gen))
    return f, events


def encode(data: Mapping[str, Any]) -> bytes:
    """One message body."""
    return json.dumps(data, separators=(",", ":")).encode()
