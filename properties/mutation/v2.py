"""The gate's mutants of vLLM V2's block tables (docs/contract.md §10), killed in the
lockstep's V2 worlds: our host-side `BlockTables` and its checks, the Triton kernels
(run there with BLOCKTABLE_V2_KERNELS=triton: the interpreter otherwise runs the
torch-native ones, for speed) and the torch-native kernels themselves. Two run in the
stateless V2 mode instead (`stateless_v2`): overlapping staged writes, which a program
makes only through a fork followed at once by a copy on write, and DCP under an
interleave that does not divide B, which a program reaches in about one world in
twenty (the lockstep finds W10 too, in minutes rather than seconds)."""

from __future__ import annotations

from blocktable.properties.mutation.mutant import Mutant

V2_KERNELS = "blocktable/kernels/v2.py"
V2_WRAPPERS = "blocktable/v2.py"
V2_CHECKS = "blocktable/v2_checks.py"
V2_TORCH = "blocktable/v2_torch.py"
TRITON_V2 = {"BLOCKTABLE_V2_KERNELS": "triton"}

V2_MUTANTS: tuple[Mutant, ...] = (
    Mutant("W01", "v2", V2_CHECKS,
           "start = 0 if overwrite else int(cnt[g, row])",
           "start = int(cnt[g, row])",
           "overwrite ignored: a resumed request's blocks appended after its old ones"),
    Mutant("W02", "v2", V2_WRAPPERS,
           "            self.cnt[g, r] = end\n",
           "            self.cnt[g, r] = max(end, int(self.cnt[g, r]))\n",
           "the count not moved back by an overwrite: a shorter row keeps its old length"),
    Mutant("W03", "v2", V2_KERNELS,
           "        tl.store(dev_ptr + kg * dev_s0 + kr * dev_s1, counts, mask=in_counts)",
           "        tl.store(dev_ptr + kg * dev_s0 + kr * dev_s1, counts, mask=in_counts & (kr > 0))",
           "device counts not updated: slot 0's count never reaches the kernels",
           env=TRITON_V2),
    Mutant("W04", "v2", V2_KERNELS,
           "    r = tl.load(idx_ptr + b, mask=b < num_reqs, other=-1).to(tl.int64)",
           "    r = tl.where(b < num_reqs, b, -1).to(tl.int64)",
           "gather by batch index instead of idx_mapping: batch position b reads slot b's row",
           env=TRITON_V2),
    Mutant("W05", "v2", V2_KERNELS,
           "        n = tl.maximum(tl.minimum(tl.minimum(n, tl.load(row_widths + g)), inp_width), 0)",
           "        n = tl.minimum(tl.load(row_widths + g), inp_width)",
           "gather past the count: the persistent row's stale columns copied too",
           env=TRITON_V2),
    Mutant("W06", "v2", V2_KERNELS,
           "            tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)",
           "            tl.store(dst + offs, tl.load(src + offs, mask=m, other=0), mask=offs < inp_width)",
           "stale columns zeroed: the gathered row's tail past the count cleared",
           env=TRITON_V2),
    Mutant("W07", "v2", V2_KERNELS,
           "        B = tl.load(kernel_blocks + g)\n",
           "        B = tl.load(kernel_blocks)\n",
           "one group's kernel block size used for every group's slot mapping",
           env=TRITON_V2),
    Mutant("W08", "v2", V2_KERNELS,
           "    dst = int32_rows(inp_ptrs, g) + b.to(tl.int64) * tl.load(inp_strides + g)",
           "    dst = int32_rows(inp_ptrs, g) + b * tl.load(inp_strides + g).to(tl.int32)",
           "int32 row offset in gather: b * stride wraps once a table holds 2**31 entries (vLLM #57030)",
           equivalent="wraps only when a batch position times the row stride reaches 2**31 (a table of 8 GiB); "
                      "the lockstep's tables are far smaller (a GPU-only stateless test has one that large)",
           env=TRITON_V2),
    Mutant("W09", "v2", V2_KERNELS,
           "        pad_from = tl.where(on, tl.load(qsl_ptr + num_reqs), 0).to(tl.int64)",
           "        pad_from = tl.where(on, tl.load(qsl_ptr + num_reqs), 0).to(tl.int64) + 1",
           "the pad tail off by one: slot T keeps the previous step's value",
           env=TRITON_V2),
    Mutant("W10", "v2", V2_KERNELS,
           "        vb = K * W\n        vbi = p // vb\n        vbo = (p - vbi * vb).to(tl.int32)\n"
           "        local = ((vbo // I) % W) == R\n        lofs = (vbo // (W * I)) * I + vbo % I"
           "  # l = vbi*K + lofs, lofs < K = P*B\n        col = vbi * (K // B) + lofs // B\n",
           "        vb = B * W\n        vbi = p // vb\n        vbo = (p - vbi * vb).to(tl.int32)\n"
           "        local = ((vbo // I) % W) == R\n        lofs = (vbo // (W * I)) * I + vbo % I"
           "  # l = vbi*K + lofs, lofs < K = P*B\n        col = vbi + lofs // B\n",
           "DCP ownership in kernel-block instead of allocation-block coordinates (vLLM #51031)",
           env=TRITON_V2, stateless_v2=("slots",)),
    Mutant("W11", "v2", V2_KERNELS,
           "    else:\n        for c0 in range(0, inp_width, COLS):",
           "    elif b >= num_reqs:\n        for c0 in range(0, inp_width, COLS):",
           "a dummy entry (-1) not zeroed: its input row keeps whatever the batch position held",
           env=TRITON_V2),
    Mutant("W12", "v2", V2_KERNELS,
           "        width = tl.where(r >= 0, tl.load(widths + g), 0)  # a dummy row has no columns: all -1",
           "        width = tl.load(widths + g)",
           "a dummy's tokens mapped through slot 0's row (vLLM #56734)",
           env=TRITON_V2),
    Mutant("W13", "v2", V2_TORCH,
           "        last[:-1] = ordered[1:] != ordered[:-1]\n        win = order[last]\n",
           "        last[1:] = ordered[1:] != ordered[:-1]\n        win = order[last]\n",
           "overlapping staged writes: the earlier one wins (torch-native append)",
           stateless_v2=("append",)),
    Mutant("W14", "v2", V2_TORCH,
           "        gathered = torch.where(copied, source, dst[:n])",
           "        gathered = torch.where(copied, source, 0)",
           "stale columns zeroed (torch-native gather)"),
)
