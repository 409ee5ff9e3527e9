"""The functions the commands call: `quantize.quantize_file`, `inspect.inspect_file`,
`validate_scheme.validate_scheme`.

Each returns a report (`qcli.report`) or raises a `QcliError`; the CLI only parses and renders. They are
usable from Python as they are. torch is imported inside the functions that touch tensors.
"""
