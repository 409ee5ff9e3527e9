"""qcli: quantize safetensors checkpoints into Burn's burnpack (.bpk) QFloat layout.

Importing qcli loads neither torch nor triton; they are imported where tensors are touched.
"""

__version__ = "0.1.0"

# The published Burn release whose byte layout and scheme serde qcli writes, and that tests/burn loads it in.
BURN_VERSION = "0.22.1"
