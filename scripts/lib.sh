# Shared by scripts/demo and scripts/test: the guard's own venv (.venv, from pyproject.toml).
# shellcheck shell=bash

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

ensure_guard_venv() {
    # Rebuilt when pyproject.toml, the build hook or the C it compiles changes (their hash is
    # stored in the venv): the editable install's C modules (hatch_build.MODULES, every .c
    # file under wrapper/) are built at install.
    local want have
    want="$(find "$REPO/wrapper" -name '*.c' -print0 | LC_ALL=C sort -z \
        | xargs -0 cat "$REPO/pyproject.toml" "$REPO/hatch_build.py" | sha256sum | cut -c1-16)"
    have="$(cat "$VENV/.pyproject-hash" 2>/dev/null || true)"
    if [[ "$want" != "$have" || ! -x "$VENV/bin/sglang-guard" ]]; then
        say "installing sglang-guard and its dev tools into $VENV"
        rm -rf "$VENV"
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install --quiet --upgrade pip >&2
        "$VENV/bin/pip" install --quiet -e "$REPO[dev]" >&2
        echo "$want" > "$VENV/.pyproject-hash"
    fi
    export PATH="$VENV/bin:$PATH"
}

ensure_sglang_env() {
    # A cached SGLang CPU venv (~6 GB each, outside the repo); prints its python.
    #   ensure_sglang_env            # 0.5.23, the release the shipped tables are read from
    #   ensure_sglang_env 0.5.18     # the older release the e2e tier also runs
    local release=${1:-0.5.23}
    say "SGLang $release CPU environment (built once, then reused)"
    "$REPO/tests/e2e/setup-sglang-cpu" --release "$release" | tail -n 1
}
