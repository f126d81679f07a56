"""Shared fixtures. Seeds are fresh per run and printed in the header; TWELL_SEED=<n> replays."""
import os
import random
import zlib

import pytest

SEED = int(os.environ.get("TWELL_SEED", random.SystemRandom().randrange(2**31)))


def pytest_report_header(config):
    return f"twell: TWELL_SEED={SEED}"


@pytest.fixture
def seed(request):
    """A seed per test, derived from the run's seed and the test id; printed on failure."""
    s = (SEED ^ zlib.crc32(request.node.nodeid.encode())) & 0x7FFFFFFF
    print(f"seed {s} (TWELL_SEED={SEED})")
    return s
