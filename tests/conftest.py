"""Shared fixtures: the repository root, and a temporary repository root for runs that write results."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    "A scratch repository root: results written during a test land here, not in book/."
    (tmp_path / "book").mkdir()
    monkeypatch.setenv("ICLR25_REPRO_ROOT", str(tmp_path))
    return tmp_path
