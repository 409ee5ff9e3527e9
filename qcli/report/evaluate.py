"""What `qcli eval` found, as data, and its `--json` document (docs/json-schema.json, `command: "eval"`)."""

from __future__ import annotations

from dataclasses import dataclass

from qcli.report.documents import JSON_SCHEMA_VERSION, finite


@dataclass(frozen=True)
class Evaluation:
    """The scores over `tokens` predictions of `windows` windows: `kl`, the mean over predictions of
    KL(source || quantized) in nats, and `kl_max`, its largest; `same_top1`, the share of predictions whose
    most likely token is the source's; `perplexity` (the quantized model's) and `source_perplexity`, the
    exponential of the mean negative log-likelihood of the token that follows."""

    windows: int
    tokens: int
    kl: float
    kl_max: float
    same_top1: float
    perplexity: float
    source_perplexity: float


@dataclass(frozen=True)
class EvalReport:
    """A quantized model's next-token predictions against its source's (`scores`), on windows of `seq_len`
    tokens of the text; the tensors the quantized file holds by what they are (`quantized`, `kept`,
    `transposed`: the decoded ones written `[in, out]`, turned back); where it ran, and how long; with
    --per-tensor, `each`: the scores of each tensor whose decoded values differ from the source's, quantized
    alone (every other at the source's values), by its name in the file."""

    quantized_path: str
    source_path: str
    config: str
    text: str
    text_sha256: str
    seq_len: int
    scores: Evaluation
    quantized: int
    kept: int
    transposed: int
    device: str
    seconds: float
    shortfall: str | None = None
    each: dict[str, Evaluation] | None = None

    @property
    def worst(self) -> list[tuple[str, Evaluation]]:
        """Each tensor scored alone (`each`, by its name in the file), the largest KL first."""
        return sorted((self.each or {}).items(), key=lambda item: (-item[1].kl, item[0]))

    def to_json(self) -> dict:
        scores = self.scores
        return {
            "command": "eval",
            "schema_version": JSON_SCHEMA_VERSION,
            "quantized": self.quantized_path,
            "source": self.source_path,
            "config": self.config,
            "text": {"name": self.text, "sha256": self.text_sha256},
            "windows": scores.windows,
            "seq_len": self.seq_len,
            "tokens": scores.tokens,
            "kl": finite(scores.kl),
            "kl_max": finite(scores.kl_max),
            "same_top1": scores.same_top1,
            "perplexity": {"source": finite(scores.source_perplexity), "quantized": finite(scores.perplexity)},
            "tensors": {"quantized": self.quantized, "kept": self.kept, "transposed": self.transposed},
            "device": self.device,
            "seconds": self.seconds,
            "warnings": [] if self.shortfall is None else [self.shortfall],
        } | ({} if self.each is None else {"per_tensor": [
            {"name": name, "kl": finite(own.kl), "kl_max": finite(own.kl_max), "same_top1": own.same_top1,
             "perplexity": finite(own.perplexity)} for name, own in self.worst]})
