"""Files in and out: the lazy safetensors source and the burnpack container.

Neither module imports torch at import time; tensors are touched only when one is loaded or written.
"""
