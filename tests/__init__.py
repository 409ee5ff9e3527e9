"""The test suite. qcli is imported first, so that from the checkout's root the name `kernels` means Hugging
Face's distribution before any test module's import chain looks for it (qcli/distributions.py)."""

import qcli  # noqa: F401
