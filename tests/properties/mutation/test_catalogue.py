"""The mutation gate in CI: every catalogued mutant still applies to the code
(a mutant whose snippet vanished would silently test nothing), and the kernel
mutants, the fast subset, are all killed. The whole catalogue runs nightly
(`blocktable mutants`, .github/workflows/nightly.yml)."""

import pytest

from blocktable.properties.mutation.catalogue import CATALOGUE
from blocktable.properties.mutation.run import build_tree, run_mutant, snippet_count


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return build_tree(tmp_path_factory.mktemp("pristine"))


@pytest.mark.parametrize("mutant", CATALOGUE, ids=lambda m: m.id)
def test_every_mutant_applies_exactly_once(pristine, mutant):
    assert mutant.old != mutant.new
    assert snippet_count(mutant, pristine) == 1, f"{mutant.id}: snippet not found once in {mutant.path}"


def test_the_catalogue_is_large_and_labelled():
    assert len(CATALOGUE) >= 30
    assert len({m.id for m in CATALOGUE}) == len(CATALOGUE)
    assert {m.layer for m in CATALOGUE} >= {"kernel", "table", "pool", "oracle kernels"}
    assert all(m.imitates for m in CATALOGUE)


KERNEL_MUTANTS = [m for m in CATALOGUE if m.layer == "kernel" and not m.equivalent]


@pytest.mark.fuzz
@pytest.mark.parametrize("mutant", KERNEL_MUTANTS, ids=lambda m: m.id)
def test_kernel_mutants_are_killed(mutant):
    verdict = run_mutant(mutant, budget=120)
    assert verdict.killed, f"{mutant.id} ({mutant.imitates}) survived {verdict.seconds:.0f} s of fuzzing"
