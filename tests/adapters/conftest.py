"""pytest's own runner for the tests of the tally_grad_norm fixture (plugin_test.py), and the tally
binary the tests read from $TALLY."""

import os

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture
def tally():
    """The tally binary the tests were built with; skips where $TALLY names none."""
    binary = os.environ.get("TALLY")
    if not binary:
        pytest.skip("TALLY names no tally binary (ci/python-test sets it)")
    return binary
