"""Test-bed stand-in for vLLM: SGLang 0.5.23's CPU rotary path imports one kernel from it."""
