"""Fixtures of the end-to-end tests on top of the session ones (tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def finished(spark, tmp_path_factory):
    """A spark_state query that ran 4 batches and stopped, run once per session (support/lifecycle.py);
    a test that changes its checkpoint copies it first."""
    from tests.support.lifecycle import finished_checkpoint

    return finished_checkpoint(spark, tmp_path_factory)
