"""`blocktable replay CASE.json`: re-run a case deterministically and print the same
report. Exit 1 if it still fails, 0 if it now passes, 2 on a usage error.
`--emit-test DIR` writes a plain pytest regression test (plus a copy of the case)."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from blocktable.cli.common import (EXIT_FAIL, EXIT_PASS, EXIT_USAGE, UsageError, add_kernel_and_device, console,
                                   crash_case, normalize_kernel, render_crash)
from blocktable.properties.messages import Job, Log

VERBOSE_VARIABLE = "BLOCKTABLE_VERBOSE"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a case file; exit 1 while it still fails", description=__doc__)
    p.add_argument("case", type=Path, help="a case file written by blocktable fuzz")
    add_kernel_and_device(p, kernel_default=None)
    p.add_argument("--emit-test", type=Path, metavar="DIR", help="write a pytest regression test for the case into DIR")
    p.add_argument("--verbose", action="store_true",
                   help=f"print every step as it runs (or set {VERBOSE_VARIABLE}=1)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from blocktable.properties.case import load

    try:
        case = load(args.case)
        kernel = normalize_kernel(args.kernel or case.kernel)
    except (ValueError, UsageError) as e:
        console.print(f"[red]blocktable replay:[/] {e}")
        return EXIT_USAGE
    if args.emit_test:
        path = emit_test(args.case, case, args.emit_test)
        console.print(f"wrote {path} (and {path.with_name(args.case.name)})")
    verbose = args.verbose or os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")
    return replay(args.case, kernel, args.device, verbose)


def replay(case_path: Path, kernel: str, device: str, verbose: bool = False) -> int:
    from blocktable.properties.child import run_in_child

    with tempfile.TemporaryDirectory() as scratch:
        journal = Path(scratch) / "journal.jsonl"
        outcome = run_in_child("blocktable.properties.engine:replay_child",
                               Job(kernel, device=device, case=str(case_path), verbose=verbose, journal=str(journal)),
                               lambda m: console.print(m.text, markup=False) if isinstance(m, Log) else None)
        result = outcome.result
        if result is None:
            case, message, where = crash_case(journal, outcome.exitcode)
            if case is None:
                console.print(message, markup=False, soft_wrap=True)
                return EXIT_FAIL
            console.print(render_crash(case, message, case_path, where, device), markup=False, soft_wrap=True)
            return EXIT_FAIL
    if result.status == "config-error":
        console.print(f"[red]blocktable replay:[/] {result.message}")
        return EXIT_USAGE
    if result.status == "pass" or result.failure is None:
        console.print(f"[green]{case_path} passes now[/] with {kernel} on {result.device}")
        return EXIT_PASS
    console.print(result.failure.report, markup=False, soft_wrap=True)
    import torch

    if device != "cpu" and torch.cuda.is_available():
        from blocktable.cli.fuzz import interpreter_verdict

        console.print(f"  triage: {interpreter_verdict(str(case_path), kernel, result.failure)}", markup=False, soft_wrap=True)
    return EXIT_FAIL


TEST_TEMPLATE = '''"""Regression test emitted by `blocktable replay --emit-test` from {case_name}.

It replays the case with the kernel the case names and fails while the discrepancy
is still there. First seen: {what}: {message}
"""

from pathlib import Path

from blocktable.properties.regression import check_case

CASE = Path(__file__).with_name({case_name!r})


def test_{slug}():
    check_case(CASE)
'''


def emit_test(case_path: Path, case, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / case_path.name
    if target.resolve() != case_path.resolve():
        shutil.copyfile(case_path, target)
    slug = "".join(c if c.isalnum() else "_" for c in case_path.stem)
    test = folder / f"test_{slug}.py"
    message = str(case.failure.get("message", "")).replace('"""', "'''").splitlines()[0][:200] if case.failure else ""
    test.write_text(TEST_TEMPLATE.format(case_name=case_path.name, slug=slug,
                                         what=case.failure.get("what", "failure"), message=message))
    return test
