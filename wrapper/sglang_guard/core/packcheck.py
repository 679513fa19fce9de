"""Rule packs checked against SGLang's option table, and the flags no rule may change.

`core/rulepack.py` checks a pack's shape; this module checks what it means for one SGLang
release: every flag a rule names (in `flags` or `when.flags`) is that release's canonical
spelling (not an alias, an abbreviation argparse would expand, an ambiguous prefix or an
unknown flag), every value fits the flag's choices, the pack's release range holds the
release, and no rule changes a flag of the deny list unless the guard config allows it
(`[rules] allow_set`). Without this, a bad flag surfaces only when its line appears, as a
crash (KeyError) with SGLang already killed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sglang_guard.core.options import OptionSpec, OptionTable
from sglang_guard.core.rulepack import FLAG_ACTIONS, SCALE, Rule, RulePack
from sglang_guard.errors import ConfigError

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
})
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

    def __init__(self, pack: RulePack, rule: Rule, table: OptionTable) -> None:
        self.pack, self.rule, self.table = pack, rule, table

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.pack.path, f"rules[{self.rule.id}].{key}",
                           f"{problem} (pack {self.pack.name!r})")

    def spec(self, key: str, flag: str) -> OptionSpec:
        spec, problem = resolve_flag(self.table, flag)
        if spec is None:
            raise self.fail(key, problem or flag)
        return spec

    def run(self, allow: Collection[str]) -> None:
        rule = self.rule
        specs = [self.spec("flags", f) for f in rule.flags]
        for flag, want in rule.conditions.flags:
            spec = self.spec("when.flags", flag)
            for value in want if isinstance(want, tuple) else ():
                if not _fits(spec, value):
                    raise self.fail(f"when.flags.{flag}",
                                    f"{value!r} is not a choice of {flag}")
        if rule.action not in FLAG_ACTIONS:
            return
        for spec in specs:
            if is_denied(spec.canonical) and spec.canonical not in allow:
                raise self.fail("flags", f"{spec.canonical} is on the deny list: no rule may "
                                "change it unless the guard config names it in "
                                "[rules] allow_set")
        for value in rule.values or ():
            if specs and not any(_fits(s, value) for s in specs):
                raise self.fail("values", f"{value!r} is not a choice of "
                                f"{' / '.join(rule.flags)}")
        if rule.action == "drop_flag":
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
        if new.startswith(SCALE):
            if spec.choices is not None:
                raise self.fail("new_value", f"{spec.canonical} takes one of its choices, "
                                "not a scaled number")
        elif not _fits(spec, new):
            raise self.fail("new_value", f"{new!r} is not a choice of {spec.canonical} "
                            f"({', '.join(spec.choices or ())})")


def check_pack(pack: RulePack, table: OptionTable, allow: Collection[str] = ()) -> RulePack:
    """`pack` itself when every rule fits `table`'s release; else a ConfigError."""
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
        _RuleCheck(pack, rule, table).run(allow)
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

