"""qcli: quantize safetensors checkpoints into Burn's burnpack (.bpk) QFloat layout.

Importing qcli loads neither torch nor triton; they are imported where tensors are touched.
"""

from qcli.distributions import shield_checkout

__version__ = "0.1.0"

# Run from a checkout, `kernels` means Hugging Face's distribution, never the folder qcli.kernels lives in.
shield_checkout()

# The published Burn release whose byte layout and scheme serde qcli writes, and that tests/burn loads it in.
BURN_VERSION = "0.22.1"
