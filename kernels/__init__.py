"""GPU path: Triton kernels that write the payload bytes of `qcli.codec.encode` (docs/arithmetic.md).

`encode` quantizes one tensor; `enqueue` (with `tensor_range` for tensors held in row chunks) is the
asynchronous form the GPU pipeline launches; `interpreted` and `searches_in_kernel` tell it how they run.
`launch` configures the kernels of `_quantize`, which share the element-wise arithmetic of `_arith`, and
of `_search` (the Mse search inside the fused kernel); `launcher` runs a configured launch again without
Triton's JIT. `gptq` launches GPTQ's column kernel (`_gptq`) for `qcli.calibrate.gptq`. Both hand the
kernels `constants`' rows. The modules whose names start with `_` hold the kernels, for this package only.
"""

if __name__ == "kernels":
    # Found by another distribution's import name from the checkout's root: that distribution is meant.
    from qcli.distributions import hand_over

    hand_over(__name__, __file__)
else:
    from qcli.kernels.launch import encode, enqueue, searches_in_kernel, tensor_range
    from qcli.kernels.launcher import interpreted

    __all__ = ["encode", "enqueue", "interpreted", "searches_in_kernel", "tensor_range"]
