"""GPU path: Triton kernels that write the payload bytes of `qcli.codec.encode` (docs/arithmetic.md)."""
