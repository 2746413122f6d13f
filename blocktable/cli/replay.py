"""`blocktable replay CASE.json`: re-run a case in a fresh process and print the same
report. Exit 1 if it still fails, 0 if it now passes, 2 on a usage error.
`--repeat N` replays it N times, each in a fresh process, and says how many failed
(for races and kernels that keep state). `--emit-test DIR` writes a plain pytest
regression test (plus a copy of the case). `--kv-write/--kv-copy/--kv-gather SPEC` and
`--v2-append/--v2-gather/--v2-slots SPEC` and `--pool CLASS` replay with another plug-in of that kind (a
fix) in place of the one the case names."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

from blocktable.cli.common import (
    EXIT_FAIL,
    EXIT_PASS,
    UsageError,
    add_call_timeout,
    add_kernel_and_device,
    check_folder,
    console,
    normalize_class,
    normalize_kernel,
    normalize_kv,
    normalize_v2,
    usage_error,
)
from blocktable.plugin import KernelSpec, replaces_slot_kernel
from blocktable.properties.cases.case import REPLAY_FAMILIES, Case, flag_of, label_of, load
from blocktable.properties.report.describe import whole_run_text
from blocktable.properties.report.report import render
from blocktable.properties.run.confirm import Attempt, interpreter_verdict, replay_case

VERBOSE_VARIABLE = "BLOCKTABLE_VERBOSE"
# An emitted test replays with the kernel it was emitted for, unless these say otherwise.
KERNEL_VARIABLE = "BLOCKTABLE_KERNEL"
DEVICE_VARIABLE = "BLOCKTABLE_DEVICE"
# How each plug-in family's specs are checked, by the prefix of its flags.
NORMALIZE: dict[str, Callable[[str, str], str]] = {"kv": normalize_kv, "v2": normalize_v2,
                                                    "classes": normalize_class}
# The case kinds that are one call of a family's kernel: their kernel is that family's plug-in.
CALL_FAMILIES = {"kv-call": "kv", "v2-call": "v2"}
Plugins = dict[str, dict[str, str]]  # family -> kind -> spec


def plugin_variable(family: str, kind: str) -> str:
    """What an emitted test reads for another plug-in of a kind: BLOCKTABLE_KV_GATHER,
    BLOCKTABLE_POOL."""
    return "BLOCKTABLE_" + label_of(family, kind).upper().replace("-", "_")


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
    add_kernel_and_device(p, kernel_default=None, device_default=None,
                          device_help="where kernels run: cpu (Triton interpreter), cuda, or auto (GPU if present); "
                                      "default: the device the case was found on, else auto")
    for family, kinds in REPLAY_FAMILIES.items():
        for kind in kinds:
            what = "ours|MODULE:Class|FILE.py:Class" if family == "classes" else "NAME|MODULE:FUNCTION|FILE.py:FUNCTION"
            p.add_argument(flag_of(family, kind), metavar=what,
                           help=f"replay with this {label_of(family, kind)} plug-in (a fix) instead of the one the "
                                f"case names")
    add_call_timeout(p)
    p.add_argument("--emit-test", type=Path, metavar="DIR", help="write a pytest regression test for the case into DIR")
    p.add_argument("--repeat", type=_positive, default=1, metavar="N",
                   help="replay N times, each in a fresh process, and report how many failed (default 1)")
    p.add_argument("--verbose", action="store_true",
                   help=f"print every step as it runs and the whole exception chain (or set {VERBOSE_VARIABLE}=1)")
    p.add_argument("--strict-nan", action="store_true",
                   help="hold NaN encodings exactly (a case found with --strict-nan replays so anyway)")
    p.set_defaults(run=run)


def _given(args: argparse.Namespace) -> Plugins:
    """The --FAMILY-KIND plug-ins named, checked, by family and kind."""
    return {family: {kind: NORMALIZE[family](kind, spec) for kind in kinds
                     if (spec := getattr(args, flag_of(family, kind)[2:].replace("-", "_"), None)) is not None}
            for family, kinds in REPLAY_FAMILIES.items()}


def _kernel_and_plugins(args: argparse.Namespace, case: Case) -> tuple[str, Plugins]:
    """The kernel to replay with and the plug-ins that replace the case's. A kv-call
    or v2-call case's kernel is a plug-in of its call's op: --kernel or the flag of
    that op (--kv-gather, --v2-slots, ...) replaces it; a flag of another kind names
    a kernel the case never calls."""
    given = _given(args)
    named = [flag_of(family, kind) for family, specs in given.items() for kind in specs]
    family = CALL_FAMILIES.get(case.kind)
    if family is None:
        if case.kind != "lockstep" and named:
            raise UsageError(f"{named[0]} names a plug-in beside the kernel, and a {case.kind} case calls none")
        if args.kernel is not None and replaces_slot_kernel({**case.classes, **given["classes"]}):
            raise UsageError(f"a table class computes its own slot mappings, so the lockstep calls no slot-mapping "
                             f"kernel: drop --kernel {args.kernel}")
        return normalize_kernel(args.kernel or case.kernel), given
    op = str((case.call or {}).get("op"))
    others = [flag for flag in named if flag != f"--{family}-{op}"]
    if others:
        raise UsageError(f"the case is one {family}-{op} call: {others[0]} names a kernel it never calls "
                         f"(--{family}-{op} or --kernel replaces its kernel)")
    if args.kernel is not None and op in given[family]:
        raise UsageError(f"--kernel and --{family}-{op} both name the {family}-{op} kernel this case calls: give one")
    spec = given[family].pop(op, "") or args.kernel or case.kernel
    return NORMALIZE[family](op, spec), given


def replay_device(case: Case, asked: str | None, gpu: bool) -> tuple[str, str | None]:
    """The --device to replay on and, when it is not where the case was found, the
    line that says so first. Without --device: the case's own device, the
    interpreter where a case found on a GPU meets a machine without one."""
    found = case.provenance.get("replay_device")
    if found not in ("cpu", "cuda"):  # older cases do not say
        return asked or "auto", None
    backend = case.provenance.get("backend") or found
    if asked is None:
        if found == "cuda" and not gpu:
            return "cpu", (f"note: this case was found on cuda ({backend}); this machine has no GPU, so it "
                           f"replays on cpu (the Triton interpreter): a pass here does not show it passes on cuda")
        return found, None
    runs_on = ("cuda" if gpu else "cpu") if asked == "auto" else asked
    if runs_on == found:
        return asked, None
    return asked, (f"note: this case was found on {found} ({backend}); it replays on {runs_on} as asked: "
                   f"a pass here does not show it passes on {found}")


def run(args: argparse.Namespace) -> int:
    try:
        case = load(args.case)  # checked against its schema before anything runs
        kernel, plugins = _kernel_and_plugins(args, case)
        if args.emit_test is not None:
            check_folder(args.emit_test, "--emit-test")
    except (ValueError, UsageError) as e:
        return usage_error("replay", str(e))
    import torch

    args.device, note = replay_device(case, args.device, torch.cuda.is_available())
    if note is not None:  # before anything runs: the reader knows where the verdict comes from
        console.print(note, markup=False, soft_wrap=True)
    if args.emit_test is not None:
        try:
            path = emit_test(args.case, case, args.emit_test, kernel, args.device, plugins)
        except OSError as e:
            return usage_error("replay", f"--emit-test {args.emit_test}: cannot write there: {e.strerror or e}")
        shown = Path(os.path.normpath(path))  # as the user would write it: regress/test_x.py, not a/../regress/...
        console.print(f"wrote {shown} (and {shown.with_name(args.case.name)})", soft_wrap=True)
    verbose = args.verbose or os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")
    if args.repeat > 1:
        return repeat(args.case, case, kernel, args.device, args.repeat, verbose, args.strict_nan, plugins,
                      args.call_timeout or None)
    return replay(args.case, kernel, args.device, verbose, case=case, strict_nan=args.strict_nan, plugins=plugins,
                  call_timeout=args.call_timeout or None)


def _with(kernel: str, case: Case, plugins: Plugins | None) -> str:
    """What the replay ran, as the closing line names it."""
    ran = {family: {**getattr(case, family), **(plugins or {}).get(family, {})} for family in REPLAY_FAMILIES}
    ran_kernel = [] if replaces_slot_kernel(ran["classes"]) else [kernel]
    return "; ".join([*ran_kernel, *(f"{label_of(family, kind)} {spec}" for family, specs in ran.items()
                                     for kind, spec in specs.items())])


def _text(attempt: Attempt) -> str:
    return render(attempt.report) if attempt.report is not None else attempt.text


def _explain_whole_run(case: Case, attempt: Attempt) -> None:
    if attempt.whole_run and case.whole_run is not None:
        console.print(f"the case alone passes in a fresh process, as when it was found; replayed its whole run "
                      f"({whole_run_text(case.whole_run)}):", markup=False, soft_wrap=True)


def replay(case_path: Path, kernel: str, device: str, verbose: bool = False, case: Case | None = None,
           strict_nan: bool = False, plugins: Plugins | None = None, call_timeout: float | None = None) -> int:
    if case is None:
        case = load(case_path)
    attempt = replay_case(case, kernel, device, case_path, verbose, kv=(plugins or {}).get("kv"),
                          on_log=lambda text: console.print(text, markup=False), strict_nan=strict_nan,
                          call_timeout=call_timeout, v2=(plugins or {}).get("v2"),
                          classes=(plugins or {}).get("classes"))
    if attempt.status == "config-error":
        return usage_error("replay", attempt.text)
    _explain_whole_run(case, attempt)
    if attempt.status == "pass":
        where = attempt.result.device if attempt.result is not None else device
        console.print(f"[green]{case_path} passes now[/] with {_with(kernel, case, plugins)} on {where}",
                      soft_wrap=True)
        return EXIT_PASS
    if attempt.report is not None and attempt.result is not None and attempt.result.failure is not None \
            and not attempt.whole_run:
        import torch

        if device != "cpu" and torch.cuda.is_available():
            attempt.report.triage = interpreter_verdict(str(case_path), kernel, attempt.result.failure)
    console.print(_text(attempt), markup=False, soft_wrap=True)
    return EXIT_FAIL


def repeat(case_path: Path, case: Case, kernel: str, device: str, times: int, verbose: bool = False,
           strict_nan: bool = False, plugins: Plugins | None = None, call_timeout: float | None = None) -> int:
    """Replay the case `times` times, each in a fresh process; print the first
    failure's report and how many failed. Exit 1 if any did."""
    failed: list[int] = []
    first: Attempt | None = None
    for i in range(times):
        attempt = replay_case(case, kernel, device, case_path, verbose, kv=(plugins or {}).get("kv"),
                              strict_nan=strict_nan, call_timeout=call_timeout, v2=(plugins or {}).get("v2"),
                          classes=(plugins or {}).get("classes"))
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
                      f"({100 * len(failed) / times:.0f}%; replays {', '.join(map(str, failed))}) with "
                      f"{_with(kernel, case, plugins)}",
                      soft_wrap=True)
        return EXIT_FAIL
    console.print(f"[green]{case_path} passed in all {times} fresh processes[/] with {_with(kernel, case, plugins)}",
                  soft_wrap=True)
    return EXIT_PASS


TEST_TEMPLATE = '''"""Regression test emitted by `blocktable replay --emit-test` from {case_name}.

It replays the case in a fresh process and fails while the case still fails.
First seen: {message}

Kernel: {kernel_doc}; set {kernel_variable} to replay another (a built-in name,
MODULE:FUNCTION or FILE.py:FUNCTION). The plug-ins the case names beside it are
read from the case file, where their paths are relative to it{plugins_doc}; set
{variables_doc} to replay another. Device: {device}; set {device_variable}
(auto, cpu or cuda) for another. Paths are relative to this file: the test runs
from any working directory and after its folder moves.
"""

import os
from pathlib import Path

from blocktable.properties.regression import check_case

HERE = Path(__file__).resolve().parent
CASE = HERE / {case_name!r}
KERNEL = {kernel_expr}
PLUGINS = {plugins_expr}
VARIABLES = {variables!r}
DEVICE = {device!r}


def test_{slug}():
    plugins = {{family: {{**PLUGINS.get(family, {{}}),
                         **{{kind: os.environ[name] for kind, name in names.items() if os.environ.get(name)}}}}
               for family, names in VARIABLES.items()}}
    check_case(CASE, kernel=os.environ.get({kernel_variable!r}) or KERNEL,
               device=os.environ.get({device_variable!r}) or DEVICE, plugins=plugins)
'''


def _kernel_expression(kernel: str, folder: Path) -> tuple[str, str]:
    """(Python for the kernel spec, how the docstring names it): a file plug-in by
    its path relative to the test's folder, anything else as it is."""
    spec = KernelSpec.parse(kernel)
    if spec.is_file:
        relative = spec.relative_to(folder).file
        # normpath: the reports the test prints name /x/kernels/mine.py, not /x/regress/../kernels/mine.py.
        return (f"f\"{{os.path.normpath(HERE / {relative!r})}}:{spec.function}\"",
                f"{spec.function} in {relative}, relative to this file")
    return repr(kernel), kernel


def _docstring_safe(text: str) -> str:
    """One line of at most 200 characters that can neither end the docstring nor escape."""
    text = text.replace('"""', "'''").replace(chr(92), "/")
    return (text.splitlines() or [""])[0][:200]


def emit_test(case_path: Path, case: Case, folder: Path, kernel: str, device: str,
              plugins: Plugins | None = None) -> Path:
    """The test and, beside it, the case with its plug-ins' paths relative to the new
    folder. `plugins`: the ones given in place of the case's, kept in the test as
    `kernel` is."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / case_path.name
    if target.resolve() != case_path.resolve():
        target.write_text(json.dumps(case.to_json(folder), indent=1) + "\n")
    given = {family: specs for family, specs in (plugins or {}).items() if specs}
    families = [f"{family!r}: {{" + ", ".join(f"{kind!r}: {_kernel_expression(spec, folder)[0]}"
                                               for kind, spec in specs.items()) + "}"
                for family, specs in given.items()]
    plugins_expr = "{" + ", ".join(families) + "}"
    variables = {family: {kind: plugin_variable(family, kind) for kind in kinds}
                 for family, kinds in REPLAY_FAMILIES.items()}
    named = [label_of(family, kind) for family in REPLAY_FAMILIES for kind in getattr(case, family)]
    plugins_doc = f" ({', '.join(named)})" if named else ""
    if given:
        plugins_doc += "; " + ", ".join(f"{label_of(family, kind)} replaced by {_kernel_expression(spec, folder)[1]}"
                                        for family, specs in given.items() for kind, spec in specs.items())
    slug = "".join(c if c.isalnum() else "_" for c in case_path.stem)
    test = folder / f"test_{slug}.py"
    message = _docstring_safe(str(case.failure.get("message") or case.failure.get("what") or "a failure"))
    kernel_expr, kernel_doc = _kernel_expression(kernel, folder)
    test.write_text(TEST_TEMPLATE.format(case_name=case_path.name, slug=slug,
                                         message=message, kernel_expr=kernel_expr,
                                         kernel_doc=_docstring_safe(kernel_doc),
                                         plugins_expr=plugins_expr, variables=variables,
                                         plugins_doc=_docstring_safe(plugins_doc),
                                         variables_doc=", ".join(v for names in variables.values()
                                                                 for v in names.values()),
                                         device=device, kernel_variable=KERNEL_VARIABLE,
                                         device_variable=DEVICE_VARIABLE))
    return test
