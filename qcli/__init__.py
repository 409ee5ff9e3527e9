"""qcli: quantize safetensors checkpoints into Burn's burnpack (.bpk) QFloat layout.

Importing qcli loads neither torch nor triton; they are imported where tensors are touched.
"""

__version__ = "0.1.0"

# The Burn revision whose byte layout and scheme serde qcli writes.
BURN_LAYOUT_PIN = "burn 0.22.0-pre.2 (2c06be35), cubecl 48348968"
