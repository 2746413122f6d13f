"""Hypothesis settings profiles, chosen with BLOCKTABLE_PROFILE (default `ci`).

- ci: derandomized (the same examples every run), bounded, no deadline; sized to fit
  CI's budget on 2 cores. Failures are saved to .hypothesis/examples, which the CI
  workflows keep as an artifact: copy it into a checkout to replay them first.
- dev: random, a few times more examples, keeps the example database for replay.
- nightly: long runs (many examples, long step programs).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILE_VARIABLE = "BLOCKTABLE_PROFILE"
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]


def register_and_load() -> str:
    database = DirectoryBasedExampleDatabase(".hypothesis/examples")
    settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                              database=database, print_blob=True, suppress_health_check=_SUPPRESS)
    settings.register_profile("dev", max_examples=200, deadline=None, print_blob=True,
                              suppress_health_check=_SUPPRESS)
    settings.register_profile("nightly", max_examples=5000, deadline=None, print_blob=True,
                              stateful_step_count=80, suppress_health_check=_SUPPRESS)
    name = os.environ.get(PROFILE_VARIABLE, "ci")
    if name not in ("ci", "dev", "nightly"):
        raise ValueError(f"{PROFILE_VARIABLE}={name!r}: expected ci, dev or nightly")
    settings.load_profile(name)
    return name
