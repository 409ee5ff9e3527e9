"""The index of a sharded checkpoint in Hugging Face's form (`model.safetensors.index.json`).

Its `weight_map` names the shard beside it that holds each tensor. qcli reads it, checks each shard is a regular
file and holds the index to what the shards hold; it writes the same form beside sharded burnpack output."""

from __future__ import annotations

from pathlib import Path

from qcli.errors import InputError
from qcli.io.files import MAX_JSON_BYTES, NOT_REGULAR_HINT, load_json, not_regular_problem
from qcli.text import printable, quoted

# A safetensors checkpoint's file that does not read as one: its index, or a shard's header.
CORRUPT_HINT = "the file is damaged or was not written as safetensors; download or export it again"
_INDEX_HINT = "the index and its shards do not belong together; download or export the checkpoint again"


def _fail(path: Path, message: str, hint: str = CORRUPT_HINT) -> InputError:
    return InputError(printable(f"{path}: {message}"), hint=hint)


def read_weight_map(index: Path, format: str) -> dict[str, Path]:
    """The tensor-to-shard map of a sharded checkpoint's index (Hugging Face's `weight_map`, which qcli
    writes for sharded burnpack output too), each shard a regular file beside the index."""
    document = load_json(index, CORRUPT_HINT, MAX_JSON_BYTES, "the index")
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise _fail(index, "no 'weight_map' of tensor names to shard files",
                    hint=f"a sharded checkpoint's index maps each tensor name to its .{format} shard")
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard or shard in ("", ".", ".."):
            raise _fail(index, f"shard {quoted(shard)} is not a file name beside the index", _INDEX_HINT)
        kind = not_regular_problem(index.parent / shard)
        if kind is not None:
            raise _fail(index, f"shard {quoted(shard)} is not a regular file ({kind})", NOT_REGULAR_HINT)
        if not (index.parent / shard).is_file():
            raise _fail(index, f"shard {quoted(shard)} is missing", hint="download every shard the index lists")
    return {name: index.parent / shard for name, shard in weight_map.items()}


def check_weight_map(index: Path, weight_map: dict[str, Path], held: list[tuple[str, Path]]) -> None:
    """Every tensor the shards hold (`held`: name and shard) is in exactly the shard the index names."""
    where: dict[str, Path] = {}
    for name, file in held:
        if name in where:
            raise _fail(index, f"tensor {quoted(name)} is in both {where[name].name} and {file.name}", _INDEX_HINT)
        where[name] = file
    for name, shard in weight_map.items():
        if where.get(name) != shard:
            raise _fail(index, f"tensor {quoted(name)} is listed in {shard.name} but that file does not hold it",
                        _INDEX_HINT)
    for name, file in where.items():
        if name not in weight_map:
            raise _fail(index, f"tensor {quoted(name)} in {file.name} is not listed in the index", _INDEX_HINT)
