"""Files in and out: the readers of checkpoints (`readers`, each a row there) and what they share (`source`,
`files`, `hf_index`), and the burnpack container.

No module imports torch at import time; tensors are touched only when one is loaded or written.
"""
