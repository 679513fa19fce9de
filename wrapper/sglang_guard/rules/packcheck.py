"""Rule packs checked against SGLang's option table, and the flags no rule may change.

`rules/rulepack.py` checks a pack's shape; this module checks what it means for one SGLang
release: every flag a rule names (in `flags` or `when.flags`) is that release's canonical
spelling (not an alias, an abbreviation argparse would expand, an ambiguous prefix or an
unknown flag), every value fits the flag's choices, the pack's release range holds the
release, and no rule changes a flag of the deny list unless the guard config allows it
(`[rules] allow_set`). A rule may list another shipped release's spelling next to this
release's own (`plan_fix` takes the first the running parser knows), never alone. Without
this, a bad flag surfaced only when its line appeared: a crash (KeyError, exit 70) with SGLang
killed, or a crash loop on a fix that could never apply.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sglang_guard.common.outcomes import FixKind
from sglang_guard.errors import ConfigError
from sglang_guard.rules.fixes import FIX_KINDS, Above, FreePort, Literal, Scale
from sglang_guard.rules.rulepack import Rule, RulePack
from sglang_guard.sglang.options import OptionSpec, OptionTable

# Flags a rule may not drop, set or rewrite: what the server trusts, serves, binds, or
# loads code from. Dropping is denied too: without --api-key or --ssl-* the server is open.
DENIED_FLAGS = frozenset({
    # credentials and TLS
    "--api-key", "--admin-api-key", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs",
    "--ssl-keyfile-password", "--enable-ssl-refresh",
    # what is served: another model, tokenizer, revision or adapter is not a fix
    "--model-path", "--tokenizer-path", "--revision", "--speculative-draft-model-path",
    "--speculative-draft-model-revision", "--lora-paths", "--uno-lora-path",
    "--json-model-override-args", "--model-loader-extra-config", "--load-format",
    "--decrypted-config-file", "--decrypted-draft-config-file",
    # code loading: remote code, import paths, hooks, plugins, sidecar modules
    "--trust-remote-code", "--enable-custom-logit-processor", "--custom-weight-loader",
    "--forward-hooks", "--sidecar", "--sidecar-args", "--tool-server",
    "--trust-request-chat-template", "--chat-template", "--completion-template",
    "--trust-mm-content-hashes",
    # where it listens, and what it lets in or sends out
    "--host", "--port", "--grpc-port", "--grpc-mode", "--smg-grpc-mode",
    "--smg-http-sidecar-port", "--fastapi-root-path", "--allowed-media-domains",
    "--dist-init-addr", "--nccl-port", "--disaggregation-bootstrap-port",
    "--engine-info-bootstrap-port", "--encoder-urls", "--encoder-register-urls",
    "--encoder-bootstrap-port", "--otlp-traces-endpoint", "--load-publish-endpoint",
    "--kv-events-config", "--decoupled-spec-bind-endpoint",
    "--decoupled-spec-connect-endpoints", "--weight-cache-socket",
    "--remote-instance-weight-loader-seed-instance-ip",
    "--remote-instance-weight-loader-seed-instance-service-port",
    "--remote-instance-weight-loader-send-weights-group-ports",
    # where it writes requests, tensors or files
    "--file-storage-path", "--crash-dump-folder", "--log-requests", "--log-requests-target",
    "--debug-tensor-dump-output-folder", "--debug-tensor-dump-input-file",
    "--export-metrics-to-file-dir", "--download-dir", "--enable-response-store",
    # SGLang 0.5.23's own config file: `sglang serve` merges the YAML it names into the
    # argv (sglang/srt/server_args.py:402 and :683); a rule setting it swaps every flag.
    "--config",
    # deletes the model directory once the server is ready
    # (sglang/srt/entrypoints/http_server.py:2602-2603, fields/model.py:356)
    "--delete-ckpt-after-loading",
    # ModelOpt: restores a saved checkpoint in place of the weights (mto.restore,
    # sglang/srt/model_loader/loader.py:3692; fields/model.py:242), or writes one out
    "--modelopt-checkpoint-restore-path", "--modelopt-checkpoint-save-path",
    "--modelopt-export-path",
    # the MoE expert placement, read from a .pt (torch.load) or JSON file it names
    # (sglang/srt/eplb/expert_location.py:770-778; fields/exec_.py:921)
    "--init-expert-location",
})
# Listening flags that only this server's own processes use (no client, no other node points
# at them): a rule may set one to a port the guard finds free (`new_value = "free_port"`),
# never to a value of its own, never drop it. `--port` (clients), `--dist-init-addr` (every
# node of a group dials it) and the other listeners stay denied, free_port or not.
INTERNAL_PORTS = frozenset({"--nccl-port"})
# A flag with one of these among its dashed words is a credential (`--max-total-tokens`
# is not: its word is "tokens").
SECRET_WORDS = frozenset({"key", "token", "secret", "password", "passwd", "credential",
                          "credentials", "apikey"})


def is_denied(flag: str) -> bool:
    """True when no rule may drop, set or rewrite `flag` (a canonical spelling)."""
    return flag in DENIED_FLAGS or bool(set(flag.lstrip("-").split("-")) & SECRET_WORDS)


def resolve_flag(table: OptionTable, flag: str) -> tuple[OptionSpec | None, str | None]:
    """The option `flag` names exactly and canonically, or None and why not."""
    look = table.lookup(flag)
    ver = table.sglang_version
    if look.kind == "exact" and look.explicit is None and look.spec is not None:
        if flag != look.spec.canonical:
            return None, f"{flag} is an alias: write {look.spec.canonical}"
        return look.spec, None
    if look.kind == "abbrev" and look.option is not None:
        return None, (f"{flag} is an abbreviation of {look.option} in SGLang {ver}: "
                      f"write {look.option}")
    if look.kind == "ambiguous":
        return None, (f"{flag} is ambiguous in SGLang {ver} "
                      f"(could match {', '.join(look.matches)})")
    return None, f"SGLang {ver} has no option {flag}"


def _fits(spec: OptionSpec, value: str) -> bool:
    return spec.choices is None or value in spec.choices


class _RuleCheck:
    """The checks of one rule; each failure a ConfigError naming pack, rule and key."""

    def __init__(self, pack: RulePack, rule: Rule, table: OptionTable,
                 elsewhere: Callable[[str], bool]) -> None:
        self.pack, self.rule, self.table, self.elsewhere = pack, rule, table, elsewhere

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.pack.path, f"rules[{self.rule.id}].{key}",
                           f"{problem} (pack {self.pack.name!r})")

    def spec(self, key: str, flag: str) -> OptionSpec | None:
        """The flag's option in this release; None for another release's own spelling."""
        spec, problem = resolve_flag(self.table, flag)
        if spec is None and not self.elsewhere(flag):
            raise self.fail(key, problem or flag)
        return spec

    def acts_here(self) -> bool:
        cond = self.rule.conditions.sglang
        try:
            return cond is None or Version(self.table.sglang_version) in SpecifierSet(cond)
        except InvalidVersion:
            return True

    def run(self, allow: Collection[str]) -> None:
        rule = self.rule
        found = [(f, self.spec("flags", f)) for f in rule.flags]
        specs = [s for _, s in found if s is not None]
        if found and not specs and self.acts_here():
            # Other releases' spellings only: on this release the rule could never act.
            raise self.fail("flags", resolve_flag(self.table, rule.flags[0])[1] or rule.flags[0])
        for flag, want in rule.conditions.flags:
            spec = self.spec("when.flags", flag)
            for value in want if isinstance(want, tuple) else ():
                if spec is not None and not _fits(spec, value):
                    raise self.fail(f"when.flags.{flag}",
                                    f"{value!r} is not a choice of {flag}")
        if not FIX_KINDS[rule.action].changes_flag:
            return
        moves_port = isinstance(rule.new_value, FreePort)
        for flag, spec in found:
            name = spec.canonical if spec is not None else flag
            if moves_port and name not in INTERNAL_PORTS:
                raise self.fail("new_value", "free_port moves only an internal port "
                                f"({', '.join(sorted(INTERNAL_PORTS))}), not {name}")
            if is_denied(name) and name not in allow and not moves_port:
                raise self.fail("flags", f"{name} is on the deny list: no rule may "
                                "change it unless the guard config names it in "
                                "[rules] allow_set")
        for value in rule.values or ():
            # A rule whose range leaves this release out never acts here: its values are
            # another release's choices (cutlass_mla, say, offered up to 0.5.19).
            if specs and self.acts_here() and not any(_fits(s, value) for s in specs):
                raise self.fail("values", f"{value!r} is not a choice of "
                                f"{' / '.join(s.canonical for s in specs)}")
        if rule.action == FixKind.DROP_FLAG:
            return
        for spec in specs:
            self.new_value(spec)

    def new_value(self, spec: OptionSpec) -> None:
        new = self.rule.new_value
        if not spec.takes_value:
            if new is not None:
                raise self.fail("new_value", f"{spec.canonical} takes no value")
            return
        if new is None:
            raise self.fail("new_value", f"{spec.canonical} needs a value")
        match new:
            case FreePort():
                return  # an internal port (checked above): any free port fits it
            case Scale():
                if spec.choices is not None:
                    raise self.fail("new_value", f"{spec.canonical} takes one of its choices, "
                                    "not a scaled number")
            case Literal(text=text) | Above(text=text) if not _fits(spec, text):
                raise self.fail("new_value", f"{text!r} is not a choice of {spec.canonical} "
                                f"({', '.join(spec.choices or ())})")


def _nowhere(flag: str) -> bool:
    return False


def check_pack(pack: RulePack, table: OptionTable, allow: Collection[str] = (),
               elsewhere: Callable[[str], bool] | None = None) -> RulePack:
    """`pack` itself when every rule fits `table`'s release; else a ConfigError.

    `elsewhere` (is this the canonical spelling of another shipped release?) admits a flag
    of another release next to this release's own spelling (`plan_fix` takes the first one the
    running parser knows), never instead of it, unless the rule's `when.sglang` keeps it off
    this release.
    """
    try:
        holds = Version(table.sglang_version) in SpecifierSet(pack.sglang_versions)
    except InvalidVersion:
        holds = True  # an unreadable table version is an unknown one
    if not holds:
        raise ConfigError(pack.path, "pack.sglang_versions",
                          f"{pack.sglang_versions!r} does not include SGLang "
                          f"{table.sglang_version}, whose options this guard checks "
                          f"(pack {pack.name!r})")
    for rule in pack.rules:
        _RuleCheck(pack, rule, table, elsewhere or _nowhere).run(allow)
    return pack


def release_to_check(versions: str, running: str | None, known: Sequence[str]) -> str | None:
    """The release a pack is checked against: the running one when the pack's range holds
    it, else the newest shipped release the range holds (None: it holds none)."""
    try:
        spec = SpecifierSet(versions)
        if running is not None and Version(running) in spec:
            return running
        inside = [v for v in known if Version(v) in spec]
    except InvalidVersion:
        return None
    return max(inside, key=Version) if inside else None


def check_allow_set(allow: Sequence[str], table: OptionTable, config_path: str | None) -> None:
    """Each `[rules] allow_set` entry is a canonical flag of the release."""
    for flag in allow:
        spec, problem = resolve_flag(table, flag)
        if spec is None:
            raise ConfigError(config_path or "<guard config>", "rules.allow_set",
                              problem or flag)

