"""End-to-end tier: the guard against real SGLang 0.5.23 on CPU (see setup-sglang-cpu)."""
