"""Hypothesis settings profiles, chosen with BLOCKTABLE_PROFILE (default `ci`).

- ci: seeded (CI_SEED; the test suite passes it as --hypothesis-seed, so every run
  draws the same examples), bounded, no deadline; sized to fit CI's budget on 2
  cores. Failures are saved to .hypothesis/examples, which the CI workflows keep as
  an artifact: copy it into a checkout and the failing examples replay first.
- dev: random, a few times more examples, keeps the example database for replay.
- nightly: long runs (many examples, long step programs).
"""

from __future__ import annotations

import gc
import os
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILE_VARIABLE = "BLOCKTABLE_PROFILE"
CI_SEED = 20261130
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]
# No "explain" phase: it re-runs random variations of a failing example for minutes
# (each one a full lockstep run), and our reports do the explaining.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]


def active() -> str:
    return os.environ.get(PROFILE_VARIABLE, "ci")


def register_and_load() -> str:
    database = DirectoryBasedExampleDatabase(".hypothesis/examples")
    settings.register_profile("ci", max_examples=40, deadline=None, database=database, print_blob=True,
                              phases=PHASES, suppress_health_check=_SUPPRESS)
    settings.register_profile("dev", max_examples=200, deadline=None, print_blob=True, phases=PHASES,
                              suppress_health_check=_SUPPRESS)
    settings.register_profile("nightly", max_examples=5000, deadline=None, print_blob=True, phases=PHASES,
                              stateful_step_count=80, suppress_health_check=_SUPPRESS)
    name = active()
    if name not in ("ci", "dev", "nightly"):
        raise ValueError(f"{PROFILE_VARIABLE}={name!r}: expected ci, dev or nightly")
    settings.load_profile(name)
    return name


# Lockstep state machines: examples per run and steps per example, by profile.
MACHINE_BUDGET = {"ci": (100, 40), "dev": (400, 50), "nightly": (20000, 80)}


def machine_settings(**overrides: Any) -> settings:
    """The active profile's settings with the lockstep machines' budget."""
    examples, steps = MACHINE_BUDGET[active()]
    base = settings.get_profile(active())
    chosen: dict[str, Any] = {"max_examples": examples, "stateful_step_count": steps, **overrides}
    return settings(base, **chosen)


# Young-generation threshold of Python's cyclic collector in processes that run the
# lockstep machines (the default is 700 allocations).
YOUNG_COLLECTION_THRESHOLD = 10_000


def collect_less() -> None:
    """Make Python's cyclic garbage collector run less often in this process.

    A lockstep run allocates containers by the hundred per step (Hypothesis's choice
    records, numpy arrays, step dicts), so with the default threshold the collector
    runs every couple of milliseconds, and now and then a full collection walks every
    object alive, Hypothesis's growing tree of examples included (a quarter of a
    million objects, 0.2 s each). On the CI profile's fixed workload (400 programs)
    this threshold took the time spent collecting from about 1 s to 0.3 s of 15 s.
    Garbage is still collected, a little later; what is tested does not change."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)


def import_every_module() -> None:
    """Import every module of blocktable now, before anything is drawn. Hypothesis
    mixes literals found in the local modules in sys.modules into its draws, and looks
    again whenever sys.modules grows; without this, what a seed draws would depend on
    which modules a run happened to import lazily before (a KV kernel on its first
    call, a plug-in's torch-native sibling), and the same seed would not give the same
    programs with and without KV worlds or plug-ins."""
    import importlib
    import pkgutil

    import blocktable
    import blocktable.kernels
    import blocktable.properties
    import blocktable.reference

    for package in (blocktable, blocktable.kernels, blocktable.properties, blocktable.reference):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(info.name)

