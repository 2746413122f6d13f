"""`blocktable replay CASE.json`: re-run a case in a fresh process and print the same
report. Exit 1 if it still fails, 0 if it now passes, 2 on a usage error.
`--repeat N` replays it N times, each in a fresh process, and says how many failed
(for races and kernels that keep state). `--emit-test DIR` writes a plain pytest
regression test (plus a copy of the case). `--v2-append/--v2-gather/--v2-slots SPEC`
replay with another V2 block-table kernel (a fix) than the one the case recorded."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from blocktable.cli.common import (
    EXIT_FAIL,
    EXIT_PASS,
    UsageError,
    add_kernel_and_device,
    add_v2_kernels,
    check_folder,
    console,
    normalize_kernel,
    normalize_kv,
    normalize_v2,
    usage_error,
    v2_specs,
)
from blocktable.plugin import KernelSpec
from blocktable.properties.cases.case import Case, load
from blocktable.properties.report.describe import whole_run_text
from blocktable.properties.report.report import render
from blocktable.properties.run.confirm import Attempt, interpreter_verdict, replay_case

VERBOSE_VARIABLE = "BLOCKTABLE_VERBOSE"
# An emitted test replays with the kernel it was emitted for, unless these say otherwise.
KERNEL_VARIABLE = "BLOCKTABLE_KERNEL"
DEVICE_VARIABLE = "BLOCKTABLE_DEVICE"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a case file; exit 1 while it still fails", description=__doc__)
    p.add_argument("case", type=Path, help="a case file written by blocktable fuzz")
    add_kernel_and_device(p, kernel_default=None)
    add_v2_kernels(p)
    p.add_argument("--emit-test", type=Path, metavar="DIR", help="write a pytest regression test for the case into DIR")
    p.add_argument("--repeat", type=_positive, default=1, metavar="N",
                   help="replay N times, each in a fresh process, and report how many failed (default 1)")
    p.add_argument("--verbose", action="store_true",
                   help=f"print every step as it runs and the whole exception chain (or set {VERBOSE_VARIABLE}=1)")
    p.add_argument("--strict-nan", action="store_true",
                   help="hold NaN encodings exactly (a case found with --strict-nan replays so anyway)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        case = load(args.case)  # checked against its schema before anything runs
        v2 = v2_specs(args)
        kernel, v2 = _kernel(case, args.kernel, v2)
        if args.emit_test is not None:
            check_folder(args.emit_test, "--emit-test")
    except (ValueError, UsageError) as e:
        return usage_error("replay", str(e))
    if args.emit_test is not None:
        try:
            path = emit_test(args.case, case, args.emit_test, kernel, args.device)
        except OSError as e:
            return usage_error("replay", f"--emit-test {args.emit_test}: cannot write there: {e.strerror or e}")
        console.print(f"wrote {path} (and {path.with_name(args.case.name)})", soft_wrap=True)
    verbose = args.verbose or os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")
    if args.repeat > 1:
        return repeat(args.case, case, kernel, args.device, args.repeat, verbose, args.strict_nan, v2)
    return replay(args.case, kernel, args.device, verbose, case=case, strict_nan=args.strict_nan, v2=v2)


def _kernel(case: Case, kernel: str | None, v2: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(the kernel the replay runs, the V2 plug-ins that replace the case's). A kv-call
    or v2-call case's kernel is a plug-in of its call's op: --kernel replaces it, and
    for a v2-call so does the --v2-* flag of that op."""
    op = str((case.call or {}).get("op"))
    if case.kind == "v2-call":
        others = [kind for kind in v2 if kind != op]
        if others:
            raise UsageError(f"the case is one v2-{op} call: --v2-{others[0]} names a kernel it never calls")
        return normalize_v2(op, v2.get(op) or kernel or case.kernel), {}
    if v2 and case.kind != "lockstep":
        raise UsageError(f"--v2-{next(iter(v2))} names a V2 block-table kernel, and a {case.kind} case calls none")
    if case.kind == "kv-call":
        return normalize_kv(op, kernel or case.kernel), v2
    return normalize_kernel(kernel or case.kernel), v2


def _text(attempt: Attempt) -> str:
    return render(attempt.report) if attempt.report is not None else attempt.text


def _explain_whole_run(case: Case, attempt: Attempt) -> None:
    if attempt.whole_run and case.whole_run is not None:
        console.print(f"the case alone passes in a fresh process, as when it was found; replayed its whole run "
                      f"({whole_run_text(case.whole_run)}):", markup=False, soft_wrap=True)


def replay(case_path: Path, kernel: str, device: str, verbose: bool = False, case: Case | None = None,
           strict_nan: bool = False, v2: dict[str, str] | None = None) -> int:
    if case is None:
        case = load(case_path)
    attempt = replay_case(case, kernel, device, case_path, verbose,
                          on_log=lambda text: console.print(text, markup=False), strict_nan=strict_nan, v2=v2)
    if attempt.status == "config-error":
        return usage_error("replay", attempt.text)
    _explain_whole_run(case, attempt)
    if attempt.status == "pass":
        where = attempt.result.device if attempt.result is not None else device
        console.print(f"[green]{case_path} passes now[/] with {kernel} on {where}", soft_wrap=True)
        return EXIT_PASS
    if attempt.report is not None and attempt.result is not None and attempt.result.failure is not None \
            and not attempt.whole_run:
        import torch

        if device != "cpu" and torch.cuda.is_available():
            attempt.report.triage = interpreter_verdict(str(case_path), kernel, attempt.result.failure)
    console.print(_text(attempt), markup=False, soft_wrap=True)
    return EXIT_FAIL


def repeat(case_path: Path, case: Case, kernel: str, device: str, times: int, verbose: bool = False,
           strict_nan: bool = False, v2: dict[str, str] | None = None) -> int:
    """Replay the case `times` times, each in a fresh process; print the first
    failure's report and how many failed. Exit 1 if any did."""
    failed: list[int] = []
    first: Attempt | None = None
    for i in range(times):
        attempt = replay_case(case, kernel, device, case_path, verbose, strict_nan=strict_nan, v2=v2)
        if attempt.status == "config-error":
            return usage_error("replay", attempt.text)
        verdict = "passes" if attempt.status == "pass" else ("crashes" if attempt.crashed else "fails")
        console.print(f"replay {i + 1} of {times}: {verdict}" + (" (the whole run)" if attempt.whole_run else ""))
        if attempt.status == "fail":
            failed.append(i + 1)
            first = first or attempt
    if first is not None:
        _explain_whole_run(case, first)
        console.print(_text(first), markup=False, soft_wrap=True)
        console.print(f"[red]{case_path} failed in {len(failed)} of {times} fresh processes[/] "
                      f"({100 * len(failed) / times:.0f}%; replays {', '.join(map(str, failed))}) with {kernel}",
                      soft_wrap=True)
        return EXIT_FAIL
    console.print(f"[green]{case_path} passed in all {times} fresh processes[/] with {kernel}", soft_wrap=True)
    return EXIT_PASS


TEST_TEMPLATE = '''"""Regression test emitted by `blocktable replay --emit-test` from {case_name}.

It replays the case in a fresh process and fails while the case still fails.
First seen: {message}

Kernel: {kernel_doc}; set {kernel_variable} to replay another (a built-in name,
MODULE:FUNCTION or FILE.py:FUNCTION). Device: {device}; set {device_variable}
(auto, cpu or cuda) for another. Paths are relative to this file: the test runs
from any working directory and after its folder moves.
"""

import os
from pathlib import Path

from blocktable.properties.regression import check_case

HERE = Path(__file__).resolve().parent
CASE = HERE / {case_name!r}
KERNEL = {kernel_expr}
DEVICE = {device!r}


def test_{slug}():
    check_case(CASE, kernel=os.environ.get({kernel_variable!r}) or KERNEL,
               device=os.environ.get({device_variable!r}) or DEVICE)
'''


def _kernel_expression(kernel: str, folder: Path) -> tuple[str, str]:
    """(Python for the kernel spec, how the docstring names it): a file plug-in by
    its path relative to the test's folder, anything else as it is."""
    spec = KernelSpec.parse(kernel)
    if spec.is_file:
        relative = spec.relative_to(folder).file
        return f"f\"{{HERE / {relative!r}}}:{spec.function}\"", f"{spec.function} in {relative}, relative to this file"
    return repr(kernel), kernel


def _docstring_safe(text: str) -> str:
    """One line of at most 200 characters that can neither end the docstring nor escape."""
    text = text.replace('"""', "'''").replace(chr(92), "/")
    return (text.splitlines() or [""])[0][:200]


def emit_test(case_path: Path, case: Case, folder: Path, kernel: str, device: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / case_path.name
    if target.resolve() != case_path.resolve():
        shutil.copyfile(case_path, target)
    slug = "".join(c if c.isalnum() else "_" for c in case_path.stem)
    test = folder / f"test_{slug}.py"
    message = _docstring_safe(str(case.failure.get("message") or case.failure.get("what") or "a failure"))
    kernel_expr, kernel_doc = _kernel_expression(kernel, folder)
    test.write_text(TEST_TEMPLATE.format(case_name=case_path.name, slug=slug,
                                         message=message, kernel_expr=kernel_expr,
                                         kernel_doc=_docstring_safe(kernel_doc),
                                         device=device, kernel_variable=KERNEL_VARIABLE,
                                         device_variable=DEVICE_VARIABLE))
    return test
