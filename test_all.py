"""The test suite: every component checked against an independent reference.

Run: python -m pytest test_all.py -q
Tests that need ../shared/data (real text) skip with a reason when it is absent.
"""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared"
DATA = SHARED / "data"
TIKTOKEN_CACHE = SHARED / "tiktoken_cache"
if "TIKTOKEN_CACHE_DIR" not in os.environ and TIKTOKEN_CACHE.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_CACHE)

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is absent (fresh machine): real-text test skipped")
needs_gpt2_files = pytest.mark.skipif(not TIKTOKEN_CACHE.is_dir(), reason="../shared/tiktoken_cache is absent: GPT-2 tokenizer files unavailable offline")


def test_skeleton_layout():
    for name in ["requirements.txt", "requirements-dev.txt", "README.md", ".ci/run"]:
        assert (ROOT / name).is_file(), name
