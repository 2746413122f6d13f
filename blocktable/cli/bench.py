"""`blocktable bench`: our slot-mapping kernels and any plug-ins side by side on a
fixed suite of shapes, each timed as CUDA-graph replays (triton.testing's
do_bench_cudagraph, median), against a measured device-to-device copy bandwidth;
then the KV kernels (blocktable.cli.bench_kv) and vLLM V2's block-table kernels
(blocktable.cli.bench_v2), each beside its torch-native twin and any plug-ins.

Every kernel's output is checked against the vectorized reference on each shape
before it is timed: a wrong kernel is reported, never ranked. The baseline,
`triton-per-request`, is vLLM's kernel design with vLLM's compile-time choices
(K, K / B, the DCP world size, rank and interleave, the pad value and the
1,024-token tile compiled in; B run-time), and the tables name it so. A plug-in named
as vLLM's (its name holds `vllm`) or given with `--baseline` is timed beside ours
and every row is also ranked against it ("× vs" that plug-in). Without a GPU the
command still runs (interpreter, tiny shapes) to check the code path: it says
first that interpreter wall times are not timings, and computes no speed-up.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from blocktable.cli import bench_kv, bench_v2
from blocktable.cli.common import (
    EXIT_FAIL,
    EXIT_PASS,
    UsageError,
    console,
    normalize_kernel,
    normalize_kv,
    normalize_v2,
    usage_error,
)
from blocktable.cli.timing import copy_bandwidth, time_call
from blocktable.device import CHOICES
from blocktable.plugin import KV_KINDS, V2_KINDS, KernelSpec

# (name, requests, tokens per request)
SHAPES = [("decode-256", 256, 1), ("decode-1024", 1024, 1), ("mixed-64x128", 64, 128),
          ("prefill-8x2048", 8, 2048), ("prefill-1x16384", 1, 16384), ("256x4096", 256, 4096),
          ("64x65536", 64, 65536)]
QUICK = [("decode-256", 256, 1), ("mixed-64x128", 64, 128), ("prefill-1x16384", 1, 16384), ("256x4096", 256, 4096)]
TINY = [("decode-8", 8, 1), ("mixed-4x32", 4, 32)]  # the interpreter: the code path, not a measurement
WORLDS = [(1, 1), (4, 16)]  # (W, I)
SUITES = ["all", "slot", "kv", "v2"]
K = B = 16
BASELINE = "triton-per-request"
OURS = ["triton-tiled", "triton-specialized"]
# What each built-in kernel is, as the tables name it.
LABELS = {BASELINE: "per-request (vLLM's design: K/W/R/I, pad, tile constexpr)",
          "triton-tiled": "tiled (run-time sizes)",
          "triton-specialized": "tiled, specialized (K/B/W/I constexpr)"}
INTERPRETER_WARNING = ("No GPU: the kernels run under Triton's interpreter. The times below are interpreter "
                       "wall times, not timings of the kernels; no speed-up is computed. This run checks the "
                       "code path and every kernel's output only.")


def label(kernel: str) -> str:
    """A built-in by what it is, a plug-in by its short name."""
    return LABELS.get(kernel) or short(kernel)


def short(spec: str) -> str:
    """A plug-in as tables name it: a file's name, not its absolute path."""
    return KernelSpec.parse(spec).short


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time the slot-mapping, KV and V2 block-table kernels side by side (GPU)",
                       description=__doc__)
    p.add_argument("--quick", action="store_true",
                   help="four slot-mapping shapes instead of seven and four V2 steps instead of eight (on a GPU; "
                        "without one, tiny shapes either way)")
    p.add_argument("--kernel", action="append", default=[], metavar="NAME|MODULE:FUNCTION|FILE.py:FUNCTION",
                   help="a further kernel to time beside ours (repeatable)")
    p.add_argument("--baseline", metavar="NAME|MODULE:FUNCTION|FILE.py:FUNCTION",
                   help="a kernel to time beside ours and rank every kernel against (\"× vs\" it); without "
                        "it, the first --kernel whose name holds 'vllm' is the one")
    p.add_argument("--device", default="auto", choices=CHOICES)
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for results.json, .md and .png")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--suite", choices=SUITES, default="all",
                   help="the slot-mapping kernels, the KV kernels (docs/contract.md §9), vLLM V2's block-table "
                        "kernels (§10), or all three (default)")
    for kind in KV_KINDS:
        p.add_argument(f"--kv-{kind}", action="append", default=[], metavar="MODULE:FUNCTION|FILE.py:FUNCTION",
                       help=f"a KV {kind} plug-in to time beside ours and torch-native (repeatable)")
    for kind in V2_KINDS:
        p.add_argument(f"--v2-{kind}", action="append", default=[], metavar="MODULE:FUNCTION|FILE.py:FUNCTION",
                       help=f"a V2 block-table {kind} plug-in to time beside ours and torch-native (repeatable)")
    p.add_argument("--strict-nan", action="store_true",
                   help="a KV plug-in's outputs must match ours with NaN encodings exact too (docs/contract.md §9)")
    p.set_defaults(run=run)


@dataclass
class Row:
    shape: str
    world: int
    interleave: int
    kernel: str
    tokens: int
    requests: int
    microseconds: float | None
    bytes: int
    ok: bool
    note: str = ""

    @property
    def gbps(self) -> float | None:
        return self.bytes / self.microseconds / 1e3 if self.microseconds else None


def make_inputs(requests: int, per_request: int, W: int, I: int, seed: int, device: Any) -> dict[str, Any]:
    import torch

    rng = np.random.default_rng(seed)
    lengths = np.full(requests, per_request, dtype=np.int64)
    context = per_request if per_request > 1 else 4096  # decode: one token at a long context
    starts = rng.integers(0, max(1, context // 2), size=requests) if per_request == 1 else np.zeros(requests, np.int64)
    qsl = np.zeros(requests + 1, dtype=np.int32)
    qsl[1:] = np.cumsum(lengths)
    T = int(qsl[-1])
    positions = (np.repeat(starts, lengths) + np.arange(T) - np.repeat(qsl[:-1], lengths)).astype(np.int64)
    width = -(-int(positions.max() + 1) // (K * W)) * (K // B)
    table = rng.integers(1, 2**31 - 1, size=(requests, width), dtype=np.int64).astype(np.int32)
    # Bytes a kernel must move at least: positions in, the output out, qsl, and each table entry used once.
    from blocktable.properties.slot.truth import slot_mapping_vectorized

    config = dict(kv_block_size=K, kernel_block_size=B, cp_world_size=W, cp_rank=0, cp_interleave=I)
    expected = slot_mapping_vectorized(qsl, positions, table, T, **config)
    request = np.repeat(np.arange(requests), lengths)
    used = np.unique(request.astype(np.int64) * width + ((positions // (K * W)) * (K // B)))
    nbytes = 8 * T + 8 * T + 4 * (requests + 1) + 4 * len(used)
    to = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    return {"qsl": to(qsl), "positions": to(positions), "table": to(table), "T": T, "config": config,
            "expected": expected, "bytes": nbytes}


def run(args: argparse.Namespace) -> int:
    try:
        extra = [normalize_kernel(k) for k in args.kernel]
        reference = normalize_kernel(args.baseline) if args.baseline else None
        if reference and reference not in extra:
            extra.append(reference)
        reference = reference or next((k for k in extra if "vllm" in short(k).lower()), None)
        kv_specs = {kind: [normalize_kv(kind, spec) for spec in getattr(args, f"kv_{kind}")]
                    for kind in KV_KINDS}
        v2_specs = {kind: [normalize_v2(kind, spec) for spec in getattr(args, f"v2_{kind}")] for kind in V2_KINDS}
    except UsageError as e:
        return usage_error("bench", str(e))
    from blocktable import device, plugin
    from blocktable.checks import data_checks
    from blocktable.properties.slot.truth import harness_kernels

    try:
        backend = device.select(args.device)
    except (RuntimeError, ValueError) as e:  # --device cuda without a GPU: a usage error, as for fuzz
        return usage_error("bench", str(e))
    cuda = backend.name == "cuda"
    try:
        kernels = {name: plugin.load(name, harness_kernels()) for name in [BASELINE, *OURS, *extra]}
        kv_extra = {kind: {short(spec): plugin.load_kv(kind, spec) for spec in kv_specs[kind]} for kind in kv_specs}
        v2_extra = {kind: {short(spec): plugin.load_v2(kind, spec) for spec in v2_specs[kind]} for kind in v2_specs}
    except plugin.PluginError as e:
        return usage_error("bench", str(e))
    if not cuda:  # after the plug-ins load: a usage error leaves stdout empty
        console.print(f"[bold yellow]WARNING:[/] {INTERPRETER_WARNING}", soft_wrap=True)
    if args.suite not in ("all", "slot"):
        kernels = {}
    shapes = ((QUICK if args.quick else SHAPES) if cuda else TINY) if kernels else []
    copy_gbps = copy_bandwidth(cuda) if args.suite != "v2" else None  # the V2 tables do not use it
    rows: list[Row] = []
    import torch

    for name, requests, per_request in shapes:
        for W, I in WORLDS:
            inputs = make_inputs(requests, per_request, W, I, args.seed, backend.device)
            for kernel_name, fn in kernels.items():
                out = torch.full((inputs["T"],), -7, dtype=torch.int64, device=backend.device)
                call = lambda: fn(inputs["qsl"], inputs["positions"], inputs["table"], out, **inputs["config"])  # noqa
                with data_checks(False):  # checks read the device back: not capturable, not the kernel's cost
                    call()
                    ok = np.array_equal(out.cpu().numpy(), inputs["expected"])
                    us, note = time_call(call, cuda) if ok else (None, "WRONG OUTPUT: not timed")
                rows.append(Row(name, W, I, kernel_name, inputs["T"], requests, us, inputs["bytes"], ok, note))
                console.print(f"{name:>16} W={W} {label(kernel_name):<52} "
                              + (f"{us:9.2f} µs" if us is not None else "        -   ") + f"  {note}",
                              markup=False)
    kv_rows: list[bench_kv.KvRow] = []
    if args.suite in ("all", "kv"):
        kv_rows, _ = bench_kv.run_suite(backend, seed=args.seed, extra=kv_extra, strict_nan=args.strict_nan,
                                        report=lambda r: console.print(
            f"{r.case:<52} {r.kernel:<10} " + (f"{r.microseconds:9.2f} µs" if r.microseconds else "        -   ")
            + f"  {r.note}", markup=False))
    v2_rows: list[bench_v2.V2Row] = []
    if args.suite in ("all", "v2"):
        v2_rows = bench_v2.run_suite(backend, seed=args.seed, quick=args.quick, extra=v2_extra,
                                     report=lambda r: console.print(
            f"{r.case:<36} {r.op:<7} {bench_v2.describe(r):<28} "
            + (f"{r.microseconds:9.2f} µs" if r.microseconds else "        -   ") + f"  {r.timing}  {r.note}",
            markup=False))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = _meta(backend, copy_gbps)
    meta["reference"] = reference if reference in kernels else None
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows],
                                                       "kv_rows": [asdict(r) for r in kv_rows],
                                                       "v2_rows": [asdict(r) for r in v2_rows]}, indent=1))
    markdown = (render_markdown(rows, meta) if rows else "") + (
        "\n## KV path\n\n" + bench_kv.render_markdown(kv_rows, copy_gbps, backend.describe()) if kv_rows else "") + (
        "\n## V2 block tables\n\n" + bench_v2.render_markdown(v2_rows, backend.describe(), cuda) if v2_rows else "")
    (args.out / "results.md").write_text(markdown)
    plotted = plot(rows, copy_gbps, args.out / "bench.png", meta) if cuda and rows else False
    console.print(markdown, markup=False, soft_wrap=True)
    why = "no GPU timings" if not cuda else "no slot-mapping rows" if not rows else "matplotlib is not installed"
    console.print(f"wrote {args.out / 'results.json'}, {args.out / 'results.md'}"
                  + (f", {args.out / 'bench.png'}" if plotted else f" (no plot: {why})"))
    passed = all(r.ok for r in rows) and all(r.ok for r in kv_rows) and all(r.ok for r in v2_rows)
    return EXIT_PASS if passed else EXIT_FAIL


def _meta(backend: Any, copy_gbps: float | None) -> dict[str, Any]:
    import datetime
    import platform

    import torch
    import triton

    return {"device": backend.describe(), "timed": backend.name == "cuda", "labels": LABELS,
            "torch": torch.__version__, "triton": triton.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
            "date": datetime.date.today().isoformat(), "copy_gbps": copy_gbps, "K": K, "B": B}


def render_markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    if not meta.get("timed", True):
        return render_untimed(rows, meta)
    copy = meta.get("copy_gbps")
    reference = meta.get("reference")
    against = f" × vs {label(reference)} |" if reference else ""
    lines = [f"Device: {meta['device']}; numpy {meta['numpy']}; {meta['date']}.",
             f"Device-to-device copy: {copy:.0f} GB/s (bytes read + written)." if copy else
             "Device-to-device copy: not measured.",
             f"K = B = {meta['K']}; times are medians of CUDA-graph replays. Baseline: {label(BASELINE)}."
             + (f" Reference: {label(reference)}." if reference else ""), "",
             "| shape | W | tokens | kernel | µs | tokens/s | GB/s | % of copy | × vs per-request |" + against,
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if reference else "")]

    def times(kernel: str | None) -> dict[tuple[str, int], float | None]:
        return {(r.shape, r.world): r.microseconds for r in rows if r.kernel == kernel}

    base, ref = times(BASELINE), times(reference)

    def ratio(to: float | None, us: float) -> str:
        return f"{to / us:.2f}×" if to else "-"

    for r in rows:
        head = f"| {r.shape} | {r.world} | {r.tokens:,} | {label(r.kernel)} |"
        if r.microseconds is None:
            lines.append(f"{head} - | - | - | - | {r.note} |" + (" - |" if reference else ""))
            continue
        gbps = r.bytes / r.microseconds / 1e3
        share = f"{100 * gbps / copy:.0f}%" if copy else "-"
        key = (r.shape, r.world)
        lines.append(f"{head} {r.microseconds:.2f} | {r.tokens / r.microseconds * 1e6:.3g} | {gbps:.0f} | "
                     f"{share} | {ratio(base.get(key), r.microseconds)} |"
                     + (f" {ratio(ref.get(key), r.microseconds)} |" if reference else ""))
    return "\n".join(lines) + "\n"


def render_untimed(rows: list[Row], meta: dict[str, Any]) -> str:
    """The interpreter's table: which kernels gave the right output, and wall times
    labelled as what they are. No rates, no speed-ups."""
    lines = [f"WARNING: {INTERPRETER_WARNING}", "",
             f"Device: {meta['device']}; numpy {meta['numpy']}; {meta['date']}; K = B = {meta['K']}.", "",
             "| shape | W | tokens | kernel | output | interpreter wall time (not a timing) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        wall = f"{r.microseconds / 1e3:.1f} ms" if r.microseconds is not None else "-"
        lines.append(f"| {r.shape} | {r.world} | {r.tokens:,} | {label(r.kernel)} | "
                     f"{'matches the reference' if r.ok else 'WRONG'} | {wall} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], copy_gbps: float | None, path: Path, meta: dict[str, Any]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for (kernel, world) in sorted({(r.kernel, r.world) for r in rows}):
        points = sorted((r.tokens, r.microseconds) for r in rows if r.kernel == kernel and r.world == world
                        and r.microseconds)
        if points:
            ax.plot(*zip(*points), marker="o", label=f"{label(kernel)}, W={world}")
    if copy_gbps:
        tokens = sorted({r.tokens for r in rows})
        floor = [next(r.bytes for r in rows if r.tokens == t) / (copy_gbps * 1e3) for t in tokens]
        ax.plot(tokens, floor, "k--", label=f"copy-bandwidth floor ({copy_gbps:.0f} GB/s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("µs (median of CUDA-graph replays)")
    ax.set_title(f"slot mapping on {meta['device'].split(' (')[0]}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
