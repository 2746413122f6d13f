"""Every wrong usage a new user tried exits 2 with one line on stderr that names the
offending value: no traceback, no progress line first, nothing on stdout. Exit 1
stays what CI gates read it as, a finding about the kernel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from blocktable.cli.common import kernel_names
from blocktable.properties.cases.schema import FORMAT, VERSION
from blocktable.properties.world import WorldConfig

ROOT = Path(__file__).resolve().parents[2]


def valid_case() -> dict:
    """A lockstep case that passes the schema (nothing here runs it)."""
    return {"format": FORMAT, "version": VERSION, "kind": "lockstep", "kernel": "reference",
            "failure": {"what": "group 0 rank 0 slot mapping", "message": "planted", "step": 2},
            "world": WorldConfig().to_json(),
            "program": [{"op": "add"}, {"op": "add"}, {"op": "step", "query": [1, 1, 0, 0], "pad": 0}],
            "call": None, "confirmation": None, "provenance": {}}


def edited(change) -> str:
    data = valid_case()
    change(data)
    return json.dumps(data)


# What each scratch file holds (None: a folder). The usages below name them.
FILES = {
    "afile": "x",
    "empty.json": "",
    "folder.json": None,
    "folder.py": None,
    "binary.json": b"\xff\xfe\x00\x01",
    "notjson.json": "not json",
    "truncated.json": json.dumps(valid_case())[:150],
    "list.json": "[1, 2]",
    "other.json": "{}",
    "v99.json": edited(lambda d: d.update(version=99)),
    "noprogram.json": edited(lambda d: d.pop("program")),
    "emptyprogram.json": edited(lambda d: d.update(program=[])),
    "shortprogram.json": edited(lambda d: d.update(program=d["program"][:1])),
    "unknownop.json": edited(lambda d: d["program"].insert(1, {"op": "explode"})),
    "badarg.json": edited(lambda d: d["program"].__setitem__(2, {"op": "step", "query": "many"})),
    "extraarg.json": edited(lambda d: d["program"].__setitem__(1, {"op": "add", "colour": 3})),
    "badrow.json": edited(lambda d: d["program"].insert(1, {"op": "swap", "a": 0, "b": 99})),
    "norequest.json": edited(lambda d: d["program"].insert(1, {"op": "fork", "parent": 7})),
    "noworld.json": edited(lambda d: d.update(world=None)),
    "worldfield.json": edited(lambda d: d["world"].pop("groups")),
    "badworld.json": edited(lambda d: d["world"]["groups"][0].update(kv_block_size=3, kernel_block_size=2)),
    "nokernel.json": edited(lambda d: d.pop("kernel")),
    "badstep.json": edited(lambda d: d["failure"].update(step="last")),
    "badcall.json": edited(lambda d: d.update(kind="slot-call", call={"name": "c"})),
    "badkvcall.json": edited(lambda d: d.update(kind="kv-call", call={"op": "write"})),
    "good.json": json.dumps(valid_case()),
    "raises_on_import.py": "import numpy\n\nX = undefined_name + 1\n",
    "syntax_error.py": "def slot_mapping(a, b, c, d, **kw)\n    pass\n",
    "kernel.py": "CONSTANT = 3\n\n\ndef slot_mapping(a, b, c, d, **kw):\n    pass\n",
    "kv_write.py": "def write(key, value, key_cache, value_cache, slot_mapping, *, layout, kv_cache_dtype, k_scale,\n"
                   "          v_scale):\n    pass\n",
}

# (arguments, what the message must say): the offending value is in it.
USAGES = [
    # fuzz: the kernel
    (["fuzz", "--kernel", "nope"], "unknown kernel 'nope': use one of " + ", ".join(kernel_names())),
    (["fuzz", "--kernel", "missing.py:fn"], "kernel file missing.py does not exist"),
    (["fuzz", "--kernel", "folder.py:fn"], "kernel file folder.py is a folder"),
    (["fuzz", "--kernel", "kernel.py"], "kernel 'kernel.py' names a file but no function"),
    (["fuzz", "--kernel", "kernel.py:"], "kernel 'kernel.py:' names no function after the colon"),
    (["fuzz", "--kernel", "kernel.py:CONSTANT"], "'CONSTANT' is not a function"),
    (["fuzz", "--kernel", "kernel.py:nothing"], "kernel.py has no function 'nothing'"),
    (["fuzz", "--kernel", "os.path:nothing_here"], "os.path has no function 'nothing_here'"),
    (["fuzz", "--kernel", "os.path:join"], "os.path:join does not follow the plug-in contract"),
    (["fuzz", "--kernel", "no_such_module_here:fn"], "cannot import module 'no_such_module_here'"),
    (["fuzz", "--kernel", ":fn"], "kernel ':fn' names no module before the colon"),
    (["fuzz", "--kernel", "raises_on_import.py:slot_mapping"], "NameError: name 'undefined_name' is not defined (at "),
    (["fuzz", "--kernel", "syntax_error.py:slot_mapping"], "SyntaxError"),
    # fuzz: the KV kernels (checked here, or when the child loads them)
    (["fuzz", "--kv-write", "nope"], "unknown kv-write kernel 'nope': use one of triton, torch, MODULE:FUNCTION"),
    (["fuzz", "--kv-copy", "missing.py:fn"], "kv-copy kernel file missing.py does not exist"),
    (["fuzz", "--kv-gather", "folder.py:fn"], "kv-gather kernel file folder.py is a folder"),
    (["fuzz", "--kv-gather", "kernel.py"], "kv-gather kernel 'kernel.py' names a file but no function"),
    (["fuzz", "--stateless", "--kv-write", "kernel.py:slot_mapping"],
     "kernel.py:slot_mapping does not follow the plug-in contract: it takes 4 positional arguments, the contract "
     "passes 5"),
    (["fuzz", "--stateless", "--kv-copy", "kernel.py:nothing"], "kernel.py has no function 'nothing'"),
    (["fuzz", "--stateless", "--kv-gather", "raises_on_import.py:gather"],
     "NameError: name 'undefined_name' is not defined (at "),
    (["fuzz", "--kv-write", "raises_on_import.py:write"], "NameError: name 'undefined_name' is not defined (at "),
    (["bench", "--kv-copy", "missing.py:fn"], "kv-copy kernel file missing.py does not exist"),
    (["bench", "--v2-gather", "missing.py:fn"], "v2-gather kernel file missing.py does not exist"),
    (["bench", "--v2-slots", "kv_write.py:write"],
     "kv_write.py:write does not follow the plug-in contract: missing keyword argument(s) kv_block_sizes, "
     "kernel_block_sizes, sharded, enabled, cp_world_size, cp_rank, cp_interleave"),
    # a plug-in of another kind: a call of this kind would leave some of its arguments unfilled
    (["fuzz", "--stateless", "--kv-copy", "kv_write.py:write"],
     "kv_write.py:write does not follow the plug-in contract of a kv-copy kernel: it needs 5 positional "
     "arguments, the contract passes 3 (key_caches, value_caches, block_mapping); value_cache, slot_mapping "
     "would have no value"),
    # fuzz: the V2 block-table kernels
    (["fuzz", "--v2-append", "nope"], "unknown v2-append kernel 'nope': use one of triton, torch, MODULE:FUNCTION"),
    (["fuzz", "--v2-slots", "missing.py:fn"], "v2-slots kernel file missing.py does not exist"),
    (["fuzz", "--v2-gather", "kv_write.py:write"],
     "kv_write.py:write does not follow the plug-in contract of a v2-gather kernel: keyword argument(s) layout, "
     "kv_cache_dtype, k_scale, v_scale have no default"),
    # fuzz: the budget and the rest
    (["fuzz", "--examples", "0"], "--examples must be >= 1, got 0"),
    (["fuzz", "--stateless", "--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    (["fuzz", "--max-tokens", "100"], "--max-tokens sizes the batches of --stateless slot-mapping fuzzing"),
    (["fuzz", "--stateless", "--kv-write", "torch", "--max-tokens", "100"],
     "--max-tokens sizes the batches of --stateless slot-mapping fuzzing: add --stateless (without --kv-* or "
     "--v2-*), or drop it"),
    (["fuzz", "--examples", "-3"], "--examples must be >= 1, got -3"),
    (["fuzz", "--examples", "abc"], "invalid int value: 'abc'"),
    (["fuzz", "--minutes", "0"], "--minutes must be a number > 0, got 0.0"),
    (["fuzz", "--minutes", "nan"], "--minutes must be a number > 0, got nan"),
    (["fuzz", "--shrink-seconds", "-1"], "--shrink-seconds must be a number >= 0, got -1.0"),
    (["fuzz", "--examples", "3", "--minutes", "1"], "argument --minutes: not allowed with argument --examples"),
    (["fuzz", "--device", "gpu"], "invalid choice: 'gpu'"),
    (["fuzz", "--profile", "fast"], "invalid choice: 'fast'"),
    (["fuzz", "--seed", "x"], "invalid int value: 'x'"),
    (["fuzz", "--exmaples", "3"], "unrecognized arguments: --exmaples 3"),
    (["fuzz", "--out", "afile"], "--out afile is a file, not a folder"),
    (["fuzz", "--out", "afile/cases"], "--out afile/cases: "),
    # replay: the case file
    (["replay", "nowhere.json"], "case file nowhere.json does not exist"),
    (["replay", "folder.json"], "case file folder.json is a folder, not a file"),
    (["replay", "empty.json"], "case file empty.json is empty"),
    (["replay", "binary.json"], "case file binary.json is not text"),
    (["replay", "notjson.json"], "case file notjson.json is not valid JSON"),
    (["replay", "truncated.json"], "case file truncated.json is not valid JSON (truncated?)"),
    (["replay", "list.json"], "case file list.json: not a blocktable case file (the JSON is a list"),
    (["replay", "other.json"], "case file other.json: not a blocktable case file (format None"),
    (["replay", "v99.json"], "case file v99.json: case file version 99 is not supported"),
    (["replay", "noprogram.json"], "case file noprogram.json: 'program' is missing"),
    (["replay", "emptyprogram.json"], "case file emptyprogram.json: the failure is at step 3 but 'program' has 0 steps"),
    (["replay", "shortprogram.json"], "the failure is at step 3 but 'program' has 1 steps"),
    (["replay", "unknownop.json"], "case file unknownop.json: program step 2: unknown operation 'explode'"),
    (["replay", "badarg.json"], "program step 3: step query='many': must be a list of integers"),
    (["replay", "extraarg.json"], "program step 2: add takes no argument 'colour'"),
    (["replay", "badrow.json"], "program step 2: swap b=99: the world has rows 0 to 3"),
    (["replay", "norequest.json"], "program step 2: fork parent=7: no step before it made request 7"),
    (["replay", "noworld.json"], "case file noworld.json: 'world' must be an object (the world), not null"),
    (["replay", "worldfield.json"], "case file worldfield.json: 'world' lacks the field 'groups'"),
    (["replay", "badworld.json"], "'world' is not a valid world: kv_block_size 3 is not a multiple of kernel_block_size 2"),
    (["replay", "nokernel.json"], "case file nokernel.json: 'kernel' is missing"),
    (["replay", "badstep.json"], "'failure.step' must be a step index (an integer >= 0) or null, not 'last'"),
    (["replay", "badcall.json"], "case file badcall.json: call: 'config' is missing"),
    (["replay", "badkvcall.json"], "case file badkvcall.json: call: 'layout' is missing"),
    (["replay", "good.json", "--emit-test", "afile"], "--emit-test afile is a file, not a folder"),
    (["replay", "good.json", "--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
    (["replay", "good.json", "--kernel", "nope"], "unknown kernel 'nope'"),
    (["replay", "good.json", "--kernel", "missing.py:fn"], "kernel file missing.py does not exist"),
    # the other commands
    (["bench", "--out", "afile"], "--out afile is a file, not a folder"),
    (["mutants", "--only", "X99"], "unknown mutant or layer X99"),
    (["mutants", "--budget", "0"], "--budget must be a number of seconds > 0, got 0.0"),
    (["mutants", "--jobs", "0"], "--jobs must be >= 1, got 0"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: COMMAND"),
]
if not torch.cuda.is_available():
    USAGES.append((["fuzz", "--device", "cuda", "--kernel", "reference"], "--device cuda was asked for"))


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    for name, content in FILES.items():
        path = tmp_path / name
        if content is None:
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("args, message", USAGES, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_a_wrong_usage_exits_2_naming_the_value_on_stderr(scratch, capsys, args, message):
    from blocktable.cli.main import main

    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert message in err, err
    assert "Traceback" not in out + err
    assert out == "", f"stdout must stay empty (no progress line, no report): {out!r}"
    assert len(err.strip().splitlines()) == 1, err  # argparse's own errors too: no usage block
    # Nothing was made: no output folder, no case file, no journal.
    assert not (scratch / "blocktable-cases").exists()


@pytest.mark.parametrize("args, line", [
    (["fuzz", "--device", "gpu"], "blocktable fuzz: argument --device: invalid choice: 'gpu' (choose from 'auto', "
                                  "'cpu', 'cuda') (see blocktable fuzz --help)"),
    ([], "blocktable: the following arguments are required: COMMAND (see blocktable --help)"),
    (["replay"], "blocktable replay: the following arguments are required: case (see blocktable replay --help)"),
    (["fuzz", "--examples"], "blocktable fuzz: argument --examples: expected one argument (see blocktable fuzz --help)"),
    (["bench", "--colour"], "blocktable: unrecognized arguments: --colour (see blocktable --help)"),
])
def test_an_argparse_error_is_one_line_with_where_to_read_more(capsys, args, line):
    from blocktable.cli.main import main

    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == line + "\n", err


def test_bench_on_cuda_without_a_gpu_is_one_line_and_exit_2(capsys):
    from blocktable.cli.main import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["bench", "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "blocktable bench: --device cuda was asked for, but torch sees no CUDA GPU\n", err


def test_every_usage_names_a_file_or_value_the_user_gave():
    """The list above is the catalogue: it must keep covering the mistakes that broke
    the exit-code promise (folders for files and files for folders, edited cases)."""
    said = " ".join(m for _, m in USAGES)
    for needed in ("--out afile is a file", "case file folder.json is a folder", "--emit-test afile is a file",
                   "'program' is missing", "'program' has 0 steps", "unknown operation", "bench"):
        assert needed in said or any(needed in " ".join(a) for a, _ in USAGES), needed
    assert len(USAGES) >= 37


def test_one_list_of_kernel_names_in_help_errors_and_docs(capsys):
    from blocktable.cli.main import main
    from blocktable.plugin import PluginError, load
    from blocktable.properties.slot.truth import harness_kernels

    names = kernel_names()
    assert names[0] == "triton" and "reference" in names
    assert main(["fuzz", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert ", ".join(names) in help_text
    with pytest.raises(PluginError) as raised:
        load("nope", harness_kernels())
    assert ", ".join(names) in str(raised.value)
    table = (ROOT / "docs" / "cli.md").read_text().split("## Kernel names")[1].split("\n## ")[0]
    documented = [name for row in table.splitlines() if row.startswith("| `")
                  for name in row.split("|")[1].replace("`", "").replace("(default)", "").split(",")]
    documented = [n.strip() for n in documented if n.strip() and ":" not in n]
    assert documented == names
