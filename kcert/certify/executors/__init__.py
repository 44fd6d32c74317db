"""Executors: what runs a kernel inside the sandbox's child process.

``cuda`` launches a cubin with CuPy; ``triton`` and ``triton-interpreter``
launch a ``@triton.jit`` function on torch tensors, on the GPU or on the CPU.
Only :mod:`kcert.certify.worker` imports the executor modules themselves;
the parent needs nothing heavier than :mod:`.base`.
"""
