"""Every tier's shared fixtures live in tests/support (see support/fixtures.py)."""

pytest_plugins = ["support.fixtures"]
