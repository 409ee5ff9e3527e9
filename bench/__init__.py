"""Benchmark scripts, run from the checkout's root. qcli is imported first, so that the name `kernels` means
Hugging Face's distribution before a benchmark's import chain looks for it (qcli/distributions.py)."""

import qcli  # noqa: F401
