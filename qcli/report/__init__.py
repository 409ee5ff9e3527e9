"""What a command found, as data: per-tensor rows, totals, timings, and the `--json` documents, a module per
command (`quantize`, `inspect`, `validate`) beside what they share (`documents`).

The CLI renders these as tables; `to_json()` gives the documents `docs/json-schema.json` describes.
Nothing here touches arrays: the statistics are computed in `qcli.codec.stats`.
"""
