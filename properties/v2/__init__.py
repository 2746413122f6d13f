"""vLLM's V2 block-table kernels (docs/contract.md §10) called alone, for the stateless
mode: random calls (draw.py), the state and the reference's answer (truth.py), the
kernel run behind guards (call.py) and the first differing element decoded (compare.py)."""
