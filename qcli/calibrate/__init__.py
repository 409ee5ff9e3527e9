"""Calibrated quantization: scales and values chosen from a layer's activations, not its weights alone."""
