"""`blocktable replay`: deterministic, exit 1 while failing and 0 once fixed, and
`--emit-test` writes a regression test that fails before the fix and passes after."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fuzz

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "numpy_slot_mapping.py"
BUG = ("ok = mine & (column < width)", "ok = mine & (column < width) & (p % 5 != 4)")


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> Path:
    """One fuzzing run that finds BUG, shared by the tests of this module (each used to
    run the same one): a folder with the buggy kernel.py and the case under
    blocktable-cases/, which names the kernel by a path relative to itself."""
    import contextlib
    import io
    import os

    from blocktable.cli.main import main

    folder = tmp_path_factory.mktemp("found")
    source = EXAMPLE_PLUGIN.read_text()
    assert source.count(BUG[0]) == 1
    (folder / "kernel.py").write_text(source.replace(*BUG))
    out, here = io.StringIO(), Path.cwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(["fuzz", "--kernel", f"{folder / 'kernel.py'}:slot_mapping", "--examples", "100", "--seed",
                         "2"])
    finally:
        os.chdir(here)
    assert code == 1, out.getvalue()
    case = folder / out.getvalue().split("case file: ")[1].split()[0]
    assert case.parent.name == "blocktable-cases" and len(list(case.parent.glob("case-*.json"))) == 1
    return folder


def failing_case(found: Path, tmp_path: Path) -> tuple[Path, Path]:
    """This test's own copy of the kernel and its case (a test may fix the kernel)."""
    import shutil

    shutil.copyfile(found / "kernel.py", tmp_path / "kernel.py")
    shutil.copytree(found / "blocktable-cases", tmp_path / "blocktable-cases")
    return tmp_path / "kernel.py", next((tmp_path / "blocktable-cases").glob("case-*.json"))


def test_replay_is_deterministic_and_follows_the_fix(cli, found, tmp_path):
    kernel, case = failing_case(found, tmp_path)
    code1, first = cli("replay", str(case))
    code2, second = cli("replay", str(case))
    assert code1 == code2 == 1 and first == second
    kernel.write_text(kernel.read_text().replace(BUG[1], BUG[0]))  # the fix
    code, out = cli("replay", str(case))
    assert code == 0 and "passes now" in out


def test_emitted_regression_test_fails_before_the_fix_and_passes_after(cli, found, tmp_path):
    kernel, case = failing_case(found, tmp_path)
    code, out = cli("replay", str(case), "--emit-test", "regressions")
    assert code == 1 and "wrote regressions/test_" in out
    folder = tmp_path / "regressions"
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)]
    before = subprocess.run(pytest_run, capture_output=True, text=True, cwd=tmp_path)
    assert before.returncode == 1, before.stdout
    kernel.write_text(kernel.read_text().replace(BUG[1], BUG[0]))
    after = subprocess.run(pytest_run, capture_output=True, text=True, cwd=tmp_path)
    assert after.returncode == 0, after.stdout


def test_verbose_replay_prints_every_step(cli, found, tmp_path, monkeypatch):
    _, case = failing_case(found, tmp_path)
    monkeypatch.setenv("BLOCKTABLE_VERBOSE", "1")
    code, out = cli("replay", str(case))
    steps = json.loads(case.read_text())["program"]
    assert code == 1
    if steps:
        assert "step 1:" in out


@pytest.mark.parametrize("content, message", [
    ("{}", "not a blocktable case file"),
    ('{"format": "blocktable-case", "version": 99, "kind": "lockstep"}', "version 99 is not supported"),
    ("not json", "is not valid JSON"),
])
def test_a_bad_case_file_exits_2(cli, tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, out = cli("replay", str(path))
    assert code == 2 and message in out


def test_a_missing_case_file_exits_2(cli):
    code, out = cli("replay", "nowhere.json")
    assert code == 2 and "does not exist" in out


def test_triage_verdicts_compare_the_compiled_failure_with_an_interpreter_replay(found, tmp_path):
    """interpreter_verdict replays the case on the interpreter; the compiled side is
    simulated here (no GPU), once agreeing with it, once not, once passing."""
    from blocktable.properties.run.confirm import interpreter_verdict, replay_attempt
    from blocktable.properties.run.messages import Failure

    kernel, case = failing_case(found, tmp_path)
    attempt = replay_attempt(str(kernel) + ":slot_mapping", "cpu", case)  # the interpreter's failure, as fields
    assert attempt.result is not None and attempt.result.failure is not None and attempt.result.failure.first
    step = attempt.result.failure.step
    token, expected, actual = attempt.result.failure.first

    def compiled(first: list[int]) -> Failure:
        return Failure(kind="lockstep", what="", message="", config="", step=step, program_steps=0, case=str(case),
                       report=attempt.report, first=first)

    same = compiled([token, expected, actual])
    assert "interpreter = compiled ≠ reference" in interpreter_verdict(str(case), str(kernel) + ":slot_mapping", same)
    other = compiled([token, expected, actual + 1])
    assert "all differ" in interpreter_verdict(str(case), str(kernel) + ":slot_mapping", other)
    kernel.write_text(kernel.read_text().replace(BUG[1], BUG[0]))  # now the interpreter agrees with the reference
    assert "reference = interpreter ≠ compiled" in interpreter_verdict(str(case), str(kernel) + ":slot_mapping", same)


ALWAYS_WRONG = ("    slot_mapping.copy_(torch.from_numpy(out))",
                "    out[:1] += 1  # every call's first slot is wrong\n    slot_mapping.copy_(torch.from_numpy(out))")


def test_an_emitted_test_copied_with_its_kernel_elsewhere_passes_and_fails_as_the_original(cli, tmp_path):
    """The emitted test replays the kernel and device `replay` was given (here not the
    case's own kernel), by a path relative to the test file: copied with its kernel
    into another folder and run from a third, it fails as the original does, and
    passes once the copy's kernel is fixed while the original still fails."""
    import os
    import shutil

    from blocktable.properties.cases.case import Case
    from blocktable.properties.slot.examples import SPEC_EXAMPLES

    project = tmp_path / "project"
    (project / "kernels").mkdir(parents=True)
    source = (Path(__file__).resolve().parents[2] / "examples" / "numpy_slot_mapping.py").read_text()
    assert source.count(ALWAYS_WRONG[0]) == 1
    (project / "kernels" / "mine.py").write_text(source.replace(*ALWAYS_WRONG))
    example = SPEC_EXAMPLES[0]
    call = example.call()
    case = Case("slot-call", "reference", {"what": "slots", "message": "seen", "step": None}, call=call)
    path = case.save(project / "cases")
    code, out = cli("replay", str(path), "--kernel", f"{project / 'kernels' / 'mine.py'}:slot_mapping",
                    "--device", "cpu", "--emit-test", str(project / "regressions"))
    assert code == 1 and "wrote " in out, out
    emitted = next((project / "regressions").glob("test_*.py")).read_text()
    assert str(tmp_path) not in emitted and "'../kernels/mine.py'" in emitted and "DEVICE = 'cpu'" in emitted
    assert "BLOCKTABLE_KERNEL" in emitted.split('"""')[1]  # the docstring names the variable
    moved = tmp_path / "moved" / "deeper"
    shutil.copytree(project, moved)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("BLOCKTABLE_KERNEL", "BLOCKTABLE_DEVICE")}
    run = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--import-mode=importlib",
           str(project / "regressions"), str(moved / "regressions")]
    before = subprocess.run(run, capture_output=True, text=True, cwd=elsewhere, env=env)
    assert "2 failed" in before.stdout and "still fails" in before.stdout, before.stdout
    mine = moved / "kernels" / "mine.py"
    mine.write_text(mine.read_text().replace(ALWAYS_WRONG[1], ALWAYS_WRONG[0]))  # the fix, in the copy only
    after = subprocess.run(run, capture_output=True, text=True, cwd=elsewhere, env=env)
    assert "1 failed, 1 passed" in after.stdout, after.stdout
    failed = [line for line in after.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "project/regressions" in failed[0], failed
