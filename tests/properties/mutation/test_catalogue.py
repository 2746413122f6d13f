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


def test_fp8_mutants_name_their_encoder_and_each_backend_reaches_one_set():
    """The fp8 write's two encoders (blocktable.kv.hardware_fp8): the integer one's
    mutants are not reached where the GPU converts, the GPU path's not where it does
    not, and every other mutant is reached everywhere."""
    by_encoder = {m.id: m.fp8_encoder for m in CATALOGUE if m.fp8_encoder}
    assert set(by_encoder.values()) == {"integer", "hardware"}
    assert all(m.layer == "kv kernels" for m in CATALOGUE if m.fp8_encoder)
    for hardware in (False, True):
        unreached = {m.id for m in CATALOGUE if m.unreached(hardware)}
        wanted = "integer" if hardware else "hardware"
        assert unreached == {i for i, encoder in by_encoder.items() if encoder == wanted}, hardware
        assert all(m.unreached(hardware) for m in CATALOGUE if m.id in unreached)


def test_the_gate_reports_an_unreached_mutant_and_does_not_run_it(monkeypatch, capsys):
    """On the CPU the GPU path's mutants are listed as not reached, with the reason,
    counted apart, never run, and do not fail the gate."""
    from blocktable.cli.main import main
    from blocktable.properties.mutation import run as mutation_run

    hardware = next(m for m in CATALOGUE if m.fp8_encoder == "hardware")
    ran = []

    def verdict(mutant, budget, seed, device, place):
        ran.append(mutant.id)
        return mutation_run.Verdict(mutant.id, mutant.layer, mutant.imitates, True, seconds_to_kill=1.0)

    monkeypatch.setattr(mutation_run, "run_mutant", verdict)
    code = main(["mutants", "--only", hardware.id, "--jobs", "1", "--device", "cpu", "--markdown"])
    out = capsys.readouterr().out
    assert code == 0 and ran == [], out
    row = next(line for line in out.splitlines() if line.startswith(f"| {hardware.id} "))
    assert "| not reached |" in row and "compute capability 8.9" in row, row
    assert out.rstrip().endswith("0/0 non-equivalent mutants killed; 1 not reached on this backend"), out
