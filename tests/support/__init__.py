"""What the test tiers share: the harness around real guards and fake children, and fixtures.

Test modules import from here, never from one another; the fixtures are registered for every
tier by tests/conftest.py (`pytest_plugins`).
"""
