"""GPU path: Triton kernels that write the payload bytes of `qcli.codec.encode` (docs/arithmetic.md).

`encode` quantizes one tensor; `enqueue` (with `tensor_range` for tensors held in row chunks) is the
asynchronous form the GPU pipeline launches. `launch` configures and runs the kernels of `_quantize`,
which share the element-wise arithmetic of `_arith`.
"""

from qcli.kernels.launch import encode, enqueue, tensor_range

__all__ = ["encode", "enqueue", "tensor_range"]
