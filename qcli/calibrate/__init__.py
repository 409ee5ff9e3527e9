"""Calibrated quantization: scales and values chosen from a layer's activations, not its weights alone.

The defaults of a calibration run, which `qcli quantize --help` states, are here, importing nothing."""

SAMPLES = 128  # windows of calibration tokens
SEQ_LEN = 512  # tokens a window
SEED = 0  # of the generator that places the windows
