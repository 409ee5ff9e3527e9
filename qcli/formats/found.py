"""What a format module says of one already-quantized weight (`qcli.formats`): a `Transcode`, an
`Encoded` weight, or why it has no transcode."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from qcli.presets import REQUANTIZE_NARROW
from qcli.problem import Kind
from qcli.scheme import QuantScheme

if TYPE_CHECKING:
    import torch

    from qcli.io.source import TensorInfo

Load = Callable[[str], "torch.Tensor"]  # a source tensor by name, as the checkpoint stores it


@dataclass(frozen=True)
class Transcode(ABC):
    """One weight written as `scheme` with its codes unchanged: its companions are consumed."""

    weight: TensorInfo
    format: str  # the source's format, as inspect names it: "F8_E4M3 with per-channel scales"
    scheme: QuantScheme
    companions: tuple[TensorInfo, ...]

    @property
    def name(self) -> str:
        """The name the weight is written under: its own, unless the format stores its codes under another
        (GPTQ's `m.qweight` is written as `m.weight`)."""
        return self.weight.name

    @property
    def shape(self) -> tuple[int, ...]:
        """The weight's shape, as the format dequantizes it."""
        return tuple(self.weight.shape)

    @property
    def reason(self) -> str:
        written = f" as {self.name}" if self.name != self.weight.name else ""
        return f"transcode {self.format} -> {self.scheme}{written}, exact"

    @abstractmethod
    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """The QFloat payload (1-D uint8) from the weight as stored (`codes`), its companions `load`ed."""

    @abstractmethod
    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """What the format's own dequantization gives, f32, of `shape`: what the payload decodes to."""

    def requantizing(self) -> Transcode:
        """This transcode under `--requantize`: what its data may hold that its scheme does not (a GGUF Q8_0
        block with the code -128) requantized rather than refused when the weight is read. Itself, for a
        format whose every weight its scheme holds."""
        return self


@dataclass(frozen=True)
class Encoded(ABC):
    """One weight no Burn scheme holds: refused (`kind`, `why`), or requantized from `dequantize`."""

    weight: TensorInfo
    format: str  # "bitsandbytes NF4"
    companions: tuple[TensorInfo, ...]

    decoded_as: ClassVar[str]  # how `--requantize` decodes it, for the refusal's hint
    requantizable: ClassVar[bool] = True  # whether `dequantize` is a way out: `--requantize`

    # Read-only properties, so that a format may set each as a class attribute or work it out per weight.
    @property
    def kind(self) -> Kind:
        """The problem its refusal is."""
        return Kind.lookup

    @property
    def encoding(self) -> str:
        """What it is, for its refused decision's reason."""
        return "a codebook"

    @property
    def offered(self) -> str:
        """The preset the refusal offers."""
        return REQUANTIZE_NARROW

    def hint(self, preset: str | None = None) -> str:
        """What to do about its refusal: requantize into `preset` (the user's own), else the one offered."""
        return (f"requantize them into a Burn scheme: --requantize {preset or self.offered} ({self.decoded_as}; "
                "--stats shows the error added to the dequantized weights)")

    @property
    def name(self) -> str:
        """The name the weight is written under once requantized: its own, unless the format stores its
        codes under another."""
        return self.weight.name

    @property
    @abstractmethod
    def why(self) -> str:
        """How the format encodes values, and why no Burn scheme holds them."""

    @property
    @abstractmethod
    def shape(self) -> tuple[int, ...]:
        """The shape it dequantizes to."""

    @property
    @abstractmethod
    def dtype(self) -> str:
        """The safetensors dtype it dequantizes to."""

    def with_state(self, load: Load) -> Encoded:
        """This weight with whatever small state its shape and dtype are read from (no weight)."""
        return self

    @abstractmethod
    def dequantize(self, load: Load) -> torch.Tensor:
        """The values the format's reference decoder gives, in `dtype`, of `shape`."""


@dataclass(frozen=True)
class Unloadable(Encoded):
    """A transcodable weight whose scheme the Burn release or backend the file is for cannot load or compute
    with (`why`): under `--requantize`, quantized into its preset from what the format's own
    dequantization gives."""

    transcode: Transcode
    unloadable: str  # why Burn cannot use the transcode's scheme

    decoded_as: ClassVar[str] = "dequantized as its format does, then quantized"

    @property
    def name(self) -> str:
        return self.transcode.name

    @property
    def why(self) -> str:
        return self.unloadable

    @property
    def shape(self) -> tuple[int, ...]:
        return self.transcode.shape

    @property
    def dtype(self) -> str:
        return "F32"

    def dequantize(self, load: Load) -> torch.Tensor:
        return self.transcode.dequantize(load(self.weight.name), load)


Found = Transcode | Encoded | str  # a string: why a quantized-looking weight has no transcode
