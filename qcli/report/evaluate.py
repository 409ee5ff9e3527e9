"""What `qcli eval` found, as data, and its `--json` document (docs/json-schema.json, `command: "eval"`)."""

from __future__ import annotations

from dataclasses import dataclass

from qcli.report.documents import JSON_SCHEMA_VERSION, finite


@dataclass(frozen=True)
class EvalReport:
    """A quantized model's next-token predictions against its source's: `kl`, the mean over predictions of
    KL(source || quantized) in nats (`kl_max`, the largest); `same_top1`, the share whose most likely token
    is the source's; both perplexities; on `windows` windows of `seq_len` tokens of the text (`tokens`
    predictions); the tensors the quantized file holds by what they are (`quantized`, `kept`,
    `transposed`: the decoded ones written `[in, out]`, turned back); where it ran, and how long."""

    quantized_path: str
    source_path: str
    config: str
    text: str
    text_sha256: str
    windows: int
    seq_len: int
    tokens: int
    kl: float
    kl_max: float
    same_top1: float
    perplexity: float
    source_perplexity: float
    quantized: int
    kept: int
    transposed: int
    device: str
    seconds: float
    shortfall: str | None = None

    def to_json(self) -> dict:
        return {
            "command": "eval",
            "schema_version": JSON_SCHEMA_VERSION,
            "quantized": self.quantized_path,
            "source": self.source_path,
            "config": self.config,
            "text": {"name": self.text, "sha256": self.text_sha256},
            "windows": self.windows,
            "seq_len": self.seq_len,
            "tokens": self.tokens,
            "kl": finite(self.kl),
            "kl_max": finite(self.kl_max),
            "same_top1": self.same_top1,
            "perplexity": {"source": finite(self.source_perplexity), "quantized": finite(self.perplexity)},
            "tensors": {"quantized": self.quantized, "kept": self.kept, "transposed": self.transposed},
            "device": self.device,
            "seconds": self.seconds,
            "warnings": [] if self.shortfall is None else [self.shortfall],
        }
