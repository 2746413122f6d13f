"""Where the kernels run: the real GPU, or Triton's interpreter on the CPU.

Triton reads TRITON_INTERPRET when `@triton.jit` decorates a kernel, that is, when a
module of `blocktable.kernels` is first imported. So the choice is made once per
process, here, before any kernel module loads, and every report names it.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from blocktable import interpreter

INTERPRET_VARIABLE = "TRITON_INTERPRET"
CHOICES = ("auto", "cpu", "cuda")
# "1": this process's waits on the GPU sleep rather than spin (block_while_waiting).
BLOCKING_SYNC_VARIABLE = "BLOCKTABLE_BLOCKING_SYNC"
CU_CTX_SCHED_BLOCKING_SYNC = 0x04  # the driver's flag (cuda.h)


@dataclass(frozen=True)
class Backend:
    name: str  # "cuda" (compiled kernels) or "interpreter" (TRITON_INTERPRET=1, CPU tensors)
    device: torch.device

    @property
    def interpreted(self) -> bool:
        return self.name == "interpreter"

    def describe(self) -> str:
        import triton

        versions = f"triton {triton.__version__}, torch {torch.__version__}"
        if self.interpreted:
            return f"Triton interpreter on the CPU ({versions})"
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(index)} (cuda:{index}, {versions})"


_selected: Backend | None = None


def _kernels_loaded() -> bool:
    return any(name.startswith("blocktable.kernels.") for name in sys.modules)


def _interpret_requested() -> bool:
    return os.environ.get(INTERPRET_VARIABLE, "0") not in ("", "0")


def chooses_gpu(preference: str) -> bool:
    """Whether a fresh process's select(preference) runs the kernels on the GPU."""
    if preference == "auto":
        return torch.cuda.is_available() and not _interpret_requested()
    return preference == "cuda"


def select(preference: str = "auto") -> Backend:
    """Choose the backend for this process ("auto": the GPU when torch sees one and
    TRITON_INTERPRET is not set, else the interpreter). A second call must agree
    with the first: a process cannot switch once the kernels are loaded."""
    global _selected
    if preference not in CHOICES:
        raise ValueError(f"device must be one of {', '.join(CHOICES)}, got {preference!r}")
    if preference == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA GPU")
    use_gpu = chooses_gpu(preference)
    wanted = "cuda" if use_gpu else "interpreter"
    if _selected is not None:
        if _selected.name != wanted and preference != "auto":
            raise RuntimeError(f"this process already runs kernels on {_selected.name}; "
                               f"start a new process for {wanted}")
        return _selected
    if _kernels_loaded() and use_gpu == _interpret_requested():
        raise RuntimeError(f"blocktable.kernels was imported with {INTERPRET_VARIABLE}="
                           f"{os.environ.get(INTERPRET_VARIABLE)!r} before the backend was chosen; "
                           f"call blocktable.device.select() first")
    if use_gpu:
        os.environ.pop(INTERPRET_VARIABLE, None)
        block_while_waiting_if_asked()  # before torch.cuda.current_device() makes the context
        _selected = Backend("cuda", torch.device("cuda", torch.cuda.current_device()))
    else:
        os.environ[INTERPRET_VARIABLE] = "1"
        _selected = Backend("interpreter", torch.device("cpu"))
        interpreter.speed_up()
    return _selected


def block_while_waiting() -> bool:
    """Make every GPU's primary context (the one torch uses) sleep in its waits for the
    device instead of spinning on a core, through the driver's
    cuDevicePrimaryCtxSetFlags_v2. A waiting process then leaves its core to others:
    where more processes share a host than it has cores to spare (a test suite's
    workers and their children), a spinning wait burns CPU they need; a lone fuzzing
    process wakes a little later from a sleep than from a spin, so this is opt-in
    (BLOCKTABLE_BLOCKING_SYNC=1). Returns whether every device took the flag (False
    where there is no driver library or a call fails: the waits then spin, as before)."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int()
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return False
        for ordinal in range(count.value):
            handle = ctypes.c_int()
            if driver.cuDeviceGet(ctypes.byref(handle), ordinal) != 0:
                return False
            if driver.cuDevicePrimaryCtxSetFlags_v2(handle, ctypes.c_uint(CU_CTX_SCHED_BLOCKING_SYNC)) != 0:
                return False
    except (OSError, AttributeError):
        return False
    return True


def block_while_waiting_if_asked() -> None:
    """block_while_waiting(), where BLOCKTABLE_BLOCKING_SYNC=1 asks for it."""
    if os.environ.get(BLOCKING_SYNC_VARIABLE) == "1":
        block_while_waiting()


def current() -> Backend:
    """The chosen backend, choosing automatically if nobody has yet."""
    return _selected if _selected is not None else select("auto")


class _Staging:
    """A ring of pinned host buffers per device that uploads from pageable memory go
    through. Pinning a fresh tensor for each small upload costs more than the copy
    itself, so the buffers are kept; each has an event that marks when the device has
    read it, and an upload waits for that before writing into its buffer. With one
    buffer, an upload waited for everything launched before the last upload (a step's
    uploads and launches alternate); with SLOTS, it waits for the upload SLOTS back,
    long read in practice. A buffer grows to the largest upload it carries (doubling),
    so the ring pins at most 2 * SLOTS times the largest upload: a few MiB in the
    lockstep, about 130 MiB for the stateless KV modes' million-element caches."""

    SLOTS = 8

    def __init__(self) -> None:
        self.buffers = [torch.empty(0, dtype=torch.uint8) for _ in range(self.SLOTS)]
        self.reads = [torch.cuda.Event() for _ in range(self.SLOTS)]
        self.turn = 0

    def reserve(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """The next buffer of the ring, once the device has read its last upload: its
        index and its first `nbytes` bytes, for the caller to fill."""
        i = self.turn
        self.turn = (i + 1) % self.SLOTS
        self.reads[i].synchronize()  # an event never recorded is complete
        if self.buffers[i].numel() < nbytes:
            size = max(nbytes, 2 * self.buffers[i].numel(), 4096)
            self.buffers[i] = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return i, self.buffers[i][:nbytes]

    def ship(self, i: int, device_tensor: torch.Tensor, staged: torch.Tensor) -> torch.Tensor:
        """Buffer i's filled bytes (`staged`, a view of them) copied to the device."""
        device_tensor.copy_(staged, non_blocking=True)
        self.reads[i].record(torch.cuda.current_stream(device_tensor.device))
        return device_tensor

    def send(self, device_tensor: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
        i, staged = self.reserve(host.numel() * host.element_size())
        staged = staged.view(host.dtype).view(host.shape)
        staged.copy_(host)
        return self.ship(i, device_tensor, staged)


_staging: dict[torch.device, _Staging] = {}


def _ring(device: torch.device) -> _Staging:
    staging = _staging.get(device)
    if staging is None:
        staging = _staging[device] = _Staging()
    return staging


def copy_from_host(device_tensor: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    """`device_tensor.copy_(host)` without waiting for the device: on a GPU from pinned
    memory, asynchronously (through a kept staging buffer unless `host` is pinned
    already: then the caller must leave `host` alone until the device has read it)."""
    if not device_tensor.is_cuda:
        return device_tensor.copy_(host)
    if host.is_pinned():
        return device_tensor.copy_(host, non_blocking=True)
    return _ring(device_tensor.device).send(device_tensor, host)


def upload(host: torch.Tensor, backend: Backend | None = None) -> torch.Tensor:
    """A new tensor on the backend's device holding a copy of a CPU tensor (never
    `host` itself, on the CPU too), sent without waiting for the device."""
    backend = backend or current()
    return copy_from_host(torch.empty(host.shape, dtype=host.dtype, device=backend.device), host)


ALIGN = 16  # bytes: where each array of upload_arrays starts (Triton specializes a pointer on 16)


def upload_arrays(arrays: Sequence[np.ndarray], backend: Backend | None = None) -> list[torch.Tensor]:
    """Device tensors holding copies of numpy arrays (of the dtypes torch shares with
    numpy), all sent in one upload without waiting for the device: each upload from
    pageable memory is a staging copy, a transfer and an event, so a caller sends a
    step's arrays together. On a GPU the arrays are written straight into a pinned
    staging buffer. Each tensor starts on an ALIGN-byte boundary of one allocation, so
    a kernel sees the same pointer alignment as in a tensor of its own; a kernel that
    writes past its tensor's end reaches the next one's bytes, as it could reach a
    neighbour in the allocator's pool."""
    backend = backend or current()
    starts, total = [], 0
    for a in arrays:
        starts.append(total)
        total += -(-a.nbytes // ALIGN) * ALIGN

    def fill(staged: torch.Tensor) -> None:
        host = staged.numpy()
        for start, a in zip(starts, arrays):
            host[start:start + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)

    if backend.device.type == "cuda":
        ring = _ring(backend.device)
        slot, staged = ring.reserve(total)
        fill(staged)
        sent = ring.ship(slot, torch.empty(total, dtype=torch.uint8, device=backend.device), staged)
    else:
        sent = torch.empty(total, dtype=torch.uint8)
        fill(sent)
    return [sent[start:start + a.nbytes].view(_torch_dtype(a.dtype)).view(a.shape)
            for start, a in zip(starts, arrays)]


@functools.cache
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A non-empty tensor's elements as flat bytes (a tensor made from a numpy array
    may carry stride 0 on a dimension of one element, which a byte view refuses)."""
    flat = t if t.dim() == 1 else t.reshape(-1)  # each view is a dispatch: a step fetches a dozen tensors
    if flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def to_host(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Copies of device tensors (any dtypes, any shapes) on the host, all brought back
    in one transfer: each read-back waits for the device, so a caller gathers what it
    needs into one. Each array is the host's own, never a view of a CPU tensor."""
    if not tensors:
        return []
    if len(tensors) == 1:  # nothing to gather into one: no launch
        (t,) = tensors
        host = t.cpu().numpy()
        return [host.copy() if t.device.type == "cpu" else host]  # .cpu() of a CPU tensor is that tensor
    parts = [_bytes(t) for t in tensors if t.numel()]
    flat = torch.cat(parts).cpu().numpy() if parts else np.zeros(0, dtype=np.uint8)
    arrays, start = [], 0
    for t in tensors:
        size = t.numel() * t.element_size()
        arrays.append(flat[start:start + size].view(_numpy_dtype(t.dtype)).reshape(t.shape))
        start += size
    return arrays


def check_tensor(name: str, tensor: object, dtype: torch.dtype, ndim: int | None = None,
                 backend: Backend | None = None) -> torch.Tensor:
    """A public call's tensor argument: right type, dtype, rank and device, or a clear
    TypeError/ValueError before anything is launched."""
    backend = backend or current()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {tensor.dtype}")
    if ndim is not None and tensor.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(tensor.shape)}")
    if tensor.device.type != backend.device.type:
        where = "CUDA tensors (the GPU backend)" if backend.name == "cuda" else "CPU tensors (the interpreter)"
        raise ValueError(f"{name} is on {tensor.device}, but kernels run on {backend.name}: pass {where}")
    return tensor
