"""Every exception the guard raises on purpose, with the exit status it maps to.

Library code raises these; only the CLI turns them into exit statuses (one line on stderr,
never a traceback).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_REMEDIATED = 1  # `check` only: the command line was changed
EXIT_USAGE = 2  # bad arguments or bad input files (model dir, config.json, TOML, YAML)
EXIT_LEADER_LOST = 76  # EX_PROTOCOL: a group worker lost (or never reached) its leader
# EX_UNAVAILABLE: SGLang's environment is broken (a kernel library built for another torch,
# a CUDA library missing, no kernel image for this GPU, a cuDNN or driver version demand).
# No restart and no flag fixes it, so `run` gives up on the first such line, and the
# systemd units do not restart on it (RestartPreventExitStatus); 75 would invite a retry.
EXIT_ENVIRONMENT = 69
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in the guard
EXIT_GIVE_UP = 75  # EX_TEMPFAIL: `run` gave up (crash loop, a fix that did not hold, busy port)
EXIT_REFUSED = 78  # EX_CONFIG: the policy refused the command line


class GuardError(Exception):
    """Base of all deliberate errors; `str()` is the one line shown to the user."""

    exit_code: int = EXIT_INTERNAL


class InputError(GuardError):
    """A bad argument or input file; the message says which and why."""

    exit_code = EXIT_USAGE


class ConfigError(InputError):
    """A guard config, rule pack or SGLang YAML that does not validate."""

    def __init__(self, path: str, key: str | None, problem: str) -> None:
        where = f"{path}: {key}" if key else path
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.key = key
        self.problem = problem


class ModelError(InputError):
    """The model directory or its config.json cannot be read."""


class SglangMissing(GuardError):
    """The interpreter that would run SGLang has none: no launch can start (exit 69)."""

    exit_code = EXIT_ENVIRONMENT


class Refused(GuardError):
    """The policy refused to launch this command line."""

    exit_code = EXIT_REFUSED


class GiveUp(GuardError):
    """The supervisor stopped trying; the message says why, `cause` says it for the metrics
    (a `common.outcomes.GiveUpCause` value)."""

    exit_code = EXIT_GIVE_UP

    def __init__(self, message: str, cause: str = "other") -> None:
        super().__init__(message)
        self.cause = cause


class LeaderLost(GuardError):
    """A multi-node worker could not reach its group's leader within the bound."""

    exit_code = EXIT_LEADER_LOST
