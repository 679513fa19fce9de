"""The outcome vocabulary: the machine's phases, the kinds of fix, the causes of a give-up.

String enums (`StrEnum`): a member equals its value, so the journal and the labels keep the
same spelling, and what still compares strings keeps working while the consumers move over.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """The supervision machine's phase (`core/machine.State.phase`)."""

    IDLE = "idle"  # nothing launched yet (preflight, the orphan clean-up)
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    PICKING = "picking"  # the old tree is gone; the shell looks for a free port
    HELD = "held"  # a worker whose SGLang exited waits for its group's leader
    DONE = "done"


class FixKind(StrEnum):
    """What a rule does when it fires (a rule pack's `action`)."""

    DROP_FLAG = "drop_flag"
    SET_FLAG = "set_flag"
    REWRITE_VALUE = "rewrite_value"
    RESTART = "restart"
    GIVE_UP = "give_up"
    UNDO_GUARD_EDIT = "undo_guard_edit"
    ENVIRONMENT = "environment"
    ADVICE = "advice"
    PARSER_EXIT = "parser_exit"  # SGLang's parser rejected the command line: exit 2


class GiveUpCause(StrEnum):
    """Why the guard gave up: the give-up record's `cause`, the metrics' `reason` label."""

    CRASH_LOOP = "crash_loop"  # max_failures within window_s
    FIX_NOT_HELD = "fix_not_held"  # a rule fired again after its fix, nothing to restore
    RULE = "rule"  # a give_up, environment or parser_exit rule, or a fix SGLang would reject
    PORT_BUSY = "port_busy"  # SGLang's port is held by another process
    STALLED = "stalled"  # a start-up stage made no progress ([start] on_stall = "give_up")
    REFUSED = "refused"  # the policy refused the command line
    OTHER = "other"

    @classmethod
    def of(cls, value: object) -> GiveUpCause:
        """The cause a record names; OTHER for none or one not known."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.OTHER
