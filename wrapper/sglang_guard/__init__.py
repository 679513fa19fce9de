"""sglang-guard: a launcher that keeps SGLang servers from dying on flags that do not fit."""

from __future__ import annotations

__version__ = "0.1.0"
