"""`python -m sglang_guard` runs the CLI."""

from __future__ import annotations

from sglang_guard.cli import main

main()
