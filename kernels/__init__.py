"""Triton kernels. Importing a module here fixes, for the whole process, whether its
kernels compile for the GPU or run under the interpreter (TRITON_INTERPRET is read
when `@triton.jit` decorates), so go through `blocktable.device.select()` first.
"""
