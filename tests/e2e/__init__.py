"""End-to-end tier: the guard against real SGLang 0.5.23 and 0.5.18 on CPU (setup-sglang-cpu)."""
