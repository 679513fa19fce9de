"""`python -m sglang_guard` runs the CLI (behind a minimal init when it is PID 1)."""

from __future__ import annotations

from sglang_guard.start import main

main()
