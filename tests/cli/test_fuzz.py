"""`blocktable fuzz` against third-party plug-ins: a correct one passes; any single
planted bug fails with exit 1, a case file and a report."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.fuzz

# One planted bug each, in the example plug-in (examples/numpy_slot_mapping.py).
PLANTED = {
    "rank test inverted": ("mine = (in_virtual_block // I) % W == R", "mine = (in_virtual_block // I) % W != R"),
    "no out-of-row guard": ("ok = mine & (column < width)", "ok = mine"),
    "int32 product": ("block = np.zeros(len(p), dtype=np.int64)", "block = np.zeros(len(p), dtype=np.int32)"),
    "ownership in kernel-block coordinates": (
        "        in_virtual_block = p % (K * W)", "        K = B\n        in_virtual_block = p % (K * W)"),
    "interleave ignored": ("local = (in_virtual_block // (W * I)) * I + in_virtual_block % I",
                           "local = in_virtual_block // W"),
    "tail not padded": ("    slot_mapping.copy_(torch.from_numpy(out))",
                        "    slot_mapping[:len(tokens)].copy_(torch.from_numpy(out[:len(tokens)]))"),
    "last request skipped": ("for request in range(len(starts) - 1):", "for request in range(len(starts) - 2):"),
    "fourth request off by one": (
        "        out[first:last] = np.where(ok, block * B + local % B, -1)",
        "        out[first:last] = np.where(ok, block * B + local % B, -1)\n"
        "        if request == 3:\n            out[first:last] = np.where(ok, block * B + (local + 1) % B, -1)"),
}


def test_a_correct_plugin_passes_200_examples(cli, plugin_file):
    path = plugin_file()
    code, out = cli("fuzz", "--kernel", f"{path}:slot_mapping", "--examples", "200", "--seed", "1")
    assert code == 0, out
    assert "no discrepancy found" in out and "blocktable fuzz" in out


# Seed 1 finds most bugs within a few programs. The fourth request's needs four
# requests in one step: seed 1 meets it at program 80, seed 3 at program 3 (the
# secrets and database tests plant it too). Found, shrunk and confirmed on the 2-core
# CPU, two runs at a time: 24.6 s under seed 1, 13.6 s under seed 3 (2026-12-06).
SEEDS = {"fourth request off by one": 3}


@pytest.mark.parametrize("bug", PLANTED)
def test_each_planted_bug_fails_with_a_case_and_a_report(cli, plugin_file, bug):
    path = plugin_file(*PLANTED[bug])
    code, out = cli("fuzz", "--kernel", f"{path}:slot_mapping", "--examples", "200", "--seed", str(SEEDS.get(bug, 1)))
    assert code == 1, out
    assert "blocktable found a discrepancy" in out
    assert "first differing element" in out or "the kernel raised" in out
    replay_line = [line for line in out.splitlines() if line.startswith("replay: blocktable replay ")]
    assert len(replay_line) == 1
    case = Path(out.split("case file: ")[1].split()[0])
    data = json.loads(case.read_text())
    assert data["format"] == "blocktable-case" and data["version"] == 2 and data["kernel"].endswith(":slot_mapping")
    assert {"python", "numpy", "torch", "triton", "hypothesis", "device"} <= set(data["provenance"])
    # The replay reproduces the same report and exits 1.
    code, replayed = cli("replay", str(case))
    assert code == 1
    first = next(line for line in out.splitlines() if line.startswith("  failure"))
    assert first in replayed


def test_a_triton_kernel_reading_one_column_past_its_row_is_caught_on_the_cpu(cli, tmp_path):
    """The guard columns around the table make the stray read return poison."""
    path = tmp_path / "past_row.py"
    path.write_text('''
import triton
import triton.language as tl


@triton.jit
def _kernel(qsl, pos, table, stride, out, K, B, W, R, I, BLOCK: tl.constexpr):
    req = tl.program_id(0)
    begin = tl.load(qsl + req)
    end = tl.load(qsl + req + 1)
    t = begin + tl.arange(0, BLOCK)
    m = t < end
    p = tl.load(pos + t, mask=m, other=0)
    vbo = p % (K * W)
    local = ((vbo // I) % W) == R
    lofs = (vbo // (W * I)) * I + vbo % I
    col = (p // (K * W)) * (K // B) + lofs // B  # no out-of-row guard: col may reach width
    blk = tl.load(table + req.to(tl.int64) * stride + col, mask=m & local, other=0).to(tl.int64)
    tl.store(out + t, tl.where(local, blk * B + lofs % B, -1), mask=m)


def slot_mapping(query_start_loc, positions, block_table, slot_mapping, *, kv_block_size, kernel_block_size,
                 cp_world_size, cp_rank, cp_interleave):
    slot_mapping.fill_(-1)
    n = query_start_loc.numel() - 1
    if n:
        _kernel[(n,)](query_start_loc, positions, block_table, block_table.stride(0), slot_mapping, kv_block_size,
                      kernel_block_size, cp_world_size, cp_rank, cp_interleave, BLOCK=2048)
''')
    code, out = cli("fuzz", "--kernel", f"{path}:slot_mapping", "--examples", "50", "--seed", "1", "--device", "cpu")
    assert code == 1, out
    assert "lies past the row" in out


SEGFAULT = "os.kill(os.getpid(), signal.SIGSEGV)"  # as an illegal memory access would


def crashing_plugin(path: Path, good: Path, condition: str, statement: str = SEGFAULT) -> Path:
    """The correct example plug-in behind a test: where `condition` holds, `statement` runs first."""
    path.write_text(f'''
import importlib.util, os, signal
spec = importlib.util.spec_from_file_location("good", {str(good)!r})
good = importlib.util.module_from_spec(spec)
spec.loader.exec_module(good)


def slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw):
    if {condition}:
        {statement}
    good.slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw)
''')
    return path


def test_a_kernel_that_kills_its_process_leaves_a_replayable_case(cli, tmp_path, plugin_file):
    path = crashing_plugin(tmp_path / "crasher.py", plugin_file(name="good.py"),
                           "positions.numel() and int(positions.max()) >= 40")
    code, out = cli("fuzz", "--kernel", f"{path}:slot_mapping", "--examples", "100", "--seed", "1")
    assert code == 1, out
    assert "was killed by signal SIGSEGV" in out
    case = Path(out.split("case file: ")[1].split()[0])
    assert json.loads(case.read_text())["failure"]["what"] == "crash"
    code, replayed = cli("replay", str(case))
    assert code == 1 and "was killed by signal SIGSEGV" in replayed


# The crash tests exercise the parent's crash handling with a numpy plug-in, so they
# pin the CPU device: on a GPU every replay process would first start CUDA (seconds
# each), and shrinking within its budget would reach less there (docs/design.md, Known limitations).
ON_THE_CPU = ("--device", "cpu")
CRASHES = {
    "segfault": (SEGFAULT, "was killed by signal SIGSEGV"),
    # On a GPU this error poisons the process; the harness ends it and treats it as a crash.
    "device fault": ('raise RuntimeError("CUDA error: an illegal memory access was encountered")',
                     "hit a device fault (an illegal memory access or the like, which poisons the process)"),
}


@pytest.mark.parametrize("crash", CRASHES)
def test_a_crash_in_a_lockstep_program_is_shrunk(cli, tmp_path, plugin_file, crash):
    """Hypothesis cannot shrink a crash (its process is gone); the parent does. The
    kernel crashes on a call that covers four rows or more: one request and a step
    suffice once the request sits in row 3 (a move or a swap) or three forks fill
    rows 1-3. Which of those the shrinker keeps depends on the program it starts
    from; it must end at five steps or fewer, down from more."""
    statement, said = CRASHES[crash]
    path = crashing_plugin(tmp_path / "crash_on_four.py", plugin_file(name="good.py"),
                           "query_start_loc.numel() > 4", statement)  # four or more rows in one call
    # Seed 4: the program that first crashes has 6 steps, more than the crash needs but
    # no more than it takes to show the shrinking (each candidate that crashes costs a
    # fresh process; seed 5's has 23). Shrinking is given all the time it could want:
    # where it ends depends on the program, not on how busy the machine is.
    code, out = cli("fuzz", "--kernel", f"{path}:slot_mapping", "--examples", "100", "--seed", "4",
                    "--shrink-seconds", "3600", "--out", str(tmp_path / "cases"), *ON_THE_CPU)
    assert code == 1, out
    found, shrunk = map(int, out.split("shrunk the crash from ")[1].split(" steps")[0].split(" to "))
    assert shrunk < found and shrunk <= 5, out
    assert f"{said} during step {shrunk}" in out
    case = Path(out.split("case file: ")[1].split()[0])
    data = json.loads(case.read_text())
    ops = [step["op"] for step in data["program"]]
    assert len(ops) == shrunk and ops[0] == "add", ops
    assert set(ops[1:-1]) <= {"add", "fork", "move", "swap"}, ops  # what puts a request in row 3
    # The call over four rows: a step's, or in a world with fresh admission the step an
    # add runs to compute what it admitted (lockstep/prefix.py).
    last = data["program"][-1]
    assert last["op"] == "step" or (last["op"] == "add" and data["world"].get("fresh_admission")), ops
    if last["op"] == "step":
        assert set(last["query"]) == {0}  # a call over four rows suffices, even with no tokens
    assert data["failure"]["found_with_steps"] == found
    assert sorted(p.name for p in (tmp_path / "cases").iterdir()) == sorted(["journal.jsonl", case.name])
    code, replayed = cli("replay", str(case), *ON_THE_CPU)
    assert code == 1 and f"{said} during step {shrunk}" in replayed


def test_a_crash_in_a_stateless_batch_says_which_and_how_to_repeat_it(cli, tmp_path, plugin_file):
    path = crashing_plugin(tmp_path / "crash_on_big.py", plugin_file(name="good.py"), "positions.numel() > 1000")
    code, out = cli("fuzz", "--stateless", "--kernel", f"{path}:slot_mapping", "--examples", "50", "--seed", "3",
                    "--out", str(tmp_path / "cases"), *ON_THE_CPU)
    assert code == 1, out
    assert "was killed by signal SIGSEGV during stateless batch" in out
    tokens = int(out.split(" requests, ")[1].split(" tokens")[0])
    assert tokens > 1000
    assert f"blocktable fuzz --stateless --seed 3 --kernel {path}:slot_mapping --max-tokens 4096" in out
    # The command said repeats it: the same batch crashes again.
    batch = out.split("during stateless batch ")[1].split()[0]
    code, again = cli("fuzz", "--stateless", "--seed", "3", "--kernel", f"{path}:slot_mapping", "--max-tokens", "4096",
                      "--out", str(tmp_path / "again"), *ON_THE_CPU)
    assert code == 1 and f"during stateless batch {batch}\n" in again, again


def test_stateless_batches_are_drawn_for_at_most_max_tokens(cli, tmp_path, plugin_file):
    # A kernel that crashes on a call of more than 512 tokens: the most that a cap of
    # 64 can give (the mixed shape: up to 256 requests of up to 2 tokens each), where
    # the default cap (4096 here) reaches it at once.
    path = crashing_plugin(tmp_path / "crash_on_big.py", plugin_file(name="good.py"), "positions.numel() > 512")
    code, out = cli("fuzz", "--stateless", "--kernel", f"{path}:slot_mapping", "--examples", "60", "--max-tokens",
                    "64", "--out", str(tmp_path / "capped"), *ON_THE_CPU)
    assert code == 0 and "60 / " in out, out
    code, out = cli("fuzz", "--stateless", "--kernel", f"{path}:slot_mapping", "--examples", "60",
                    "--out", str(tmp_path / "default"), *ON_THE_CPU)
    assert code == 1 and "during stateless batch" in out, out


# Usage errors: tests/cli/test_usage.py.


FAULTING_TRITON_PLUGIN = '''
import triton
import triton.language as tl

from blocktable.slot import slot_mapping_tiled


@triton.jit
def stray_write(ptr):
    tl.store(ptr + (1 << 44), 7)  # 128 TiB past the output: no memory there


def slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw):
    if query_start_loc.numel() > 4:  # four or more requests in one call
        stray_write[(1,)](slot_mapping)
    slot_mapping_tiled(query_start_loc, positions, block_table, slot_mapping, **kw)
'''


@pytest.mark.gpu
def test_a_real_illegal_memory_access_on_the_gpu_is_a_shrunk_device_fault(cli, tmp_path):
    """A compiled kernel's stray write: CUDA reports it at the next sync, poisons the
    process, and the child must end at once for the parent to shrink and replay it
    in fresh processes (the CPU test above only raises CUDA's message)."""
    path = tmp_path / "stray_write.py"
    path.write_text(FAULTING_TRITON_PLUGIN)
    code, out = cli("fuzz", "--kernel", f"{path}:slot_mapping", "--examples", "100", "--seed", "4",
                    "--shrink-seconds", "60", "--out", str(tmp_path / "cases"))
    said = "hit a device fault (an illegal memory access or the like, which poisons the process)"
    assert code == 1, out
    assert said in out, out
    case = Path(out.split("case file: ")[1].split()[0])
    data = json.loads(case.read_text())
    assert data["failure"]["what"] == "crash"
    assert data["failure"]["found_with_steps"] >= len(data["program"]) >= 5, data["program"]
    code, replayed = cli("replay", str(case))
    assert code == 1 and said in replayed, replayed


def test_a_lockstep_run_leaves_hypothesis_storage_where_the_docs_say(cli, tmp_path, monkeypatch, plugin_file):
    """A run leaves `.hypothesis/` (Hypothesis's cache of constants and a .gitignore)
    in the folder it was started from, or where HYPOTHESIS_STORAGE_DIRECTORY says, and
    nothing else once it passes; docs/cli.md says so, by those names."""
    kernel = f"{plugin_file()}:slot_mapping"
    for work, storage in ((tmp_path / "here", None), (tmp_path / "there", tmp_path / "storage")):
        work.mkdir()
        monkeypatch.chdir(work)
        if storage is not None:
            monkeypatch.setenv("HYPOTHESIS_STORAGE_DIRECTORY", str(storage))
        code, out = cli("fuzz", "--kernel", kernel, "--examples", "2", "--device", "cpu")
        assert code == 0, out
        kept = storage or work / ".hypothesis"
        assert sorted(p.name for p in work.iterdir()) == ([] if storage else [".hypothesis"])
        assert sorted(p.name for p in kept.iterdir()) == [".gitignore", "constants"]
    docs = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    fuzz = docs.split("## `blocktable fuzz`")[1].split("\n## ")[0]
    for said in ("`.hypothesis/`", "`constants/`", "`.gitignore`", "`HYPOTHESIS_STORAGE_DIRECTORY=DIR`"):
        assert said in fuzz, said
    assert "\n| `HYPOTHESIS_STORAGE_DIRECTORY` | " in docs
