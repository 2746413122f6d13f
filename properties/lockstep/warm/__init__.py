"""Every Triton compilation a lockstep run on a GPU can ask for of our kernels, made
ahead.

Triton compiles a kernel once per variant: per dtype of each tensor, per value of each
compile-time constant, and per pattern of the arguments it specializes (an integer
equal to 1 or a multiple of 16, a pointer's 16-byte alignment) unless the kernel
leaves them unspecialized. A run meets the variants in the order its programs draw
them and compiles each on first use, about a third of a second apiece on an H100 host
(docs/results.md). Here each one is made by a tiny launch through our own wrappers,
with tensors laid out as a run lays them out, so that Triton's disk cache holds them
before a run needs them: the run then loads each one instead of compiling it.

One module per family of kernels: the slot-mapping kernel under test where it is
ours (slot.py), the data oracle's instruments (oracle.py), the V2 block tables'
kernels (v2.py), and the KV kernels, per kind of KV world (kv.py). The first three
come first: a run needs them from its first step on.
tests/properties/lockstep/test_warm.py holds that a seeded run of the default mix asks
for no variant that these calls do not make.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from blocktable.device import Backend
from blocktable.plugin import KVKernels
from blocktable.properties.lockstep.warm import kv, oracle, slot, v2


class WarmCall(Protocol):
    """A few launches of one family's kernels (the KV kernels given; the other
    families' are always ours)."""

    def describe(self) -> str: ...

    def launches(self, kernels: KVKernels, backend: Backend) -> Iterator[str]:
        """The call's launches, one at a time (each yields what it launched)."""
        ...


def warm_calls() -> list[WarmCall]:
    """Every call, those a run needs first first."""
    return [*slot.calls(), *oracle.calls(), *v2.calls(), *kv.calls()]
