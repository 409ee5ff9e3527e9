"""The CPU codec: a float tensor to the bytes of a Burn QFloat payload and back (docs/arithmetic.md).

`encode` and `decode` are what the pipelines call; `quantize_parts`, `round_up` and `pack` expose the
intermediate steps the GPU path is compared against.
"""

from qcli.codec.decode import decode
from qcli.codec.quantize import QuantizedParts, encode, pack, quantize_parts
from qcli.codec.scales import round_up
from qcli.codec.stats import error_stats

__all__ = [
    "QuantizedParts",
    "decode",
    "encode",
    "error_stats",
    "pack",
    "quantize_parts",
    "round_up",
]
