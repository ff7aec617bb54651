"""GGUF model files: read their metadata and refuse files that are not whole GGUFs.

The header is parsed directly (with the `gguf` package's type tables) instead of through
`gguf.GGUFReader`, which builds a numpy view per vocabulary entry and takes seconds on a
100 MB model; this parser reads the same fields in milliseconds and never touches tensor data.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_MAX_COUNT = 1 << 32  # sanity bound for tensor / key / array counts

_SCALAR_FORMATS: dict[int, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


class InvalidModelFile(Exception):
    """The file is missing, not a GGUF, truncated or otherwise unusable as a model."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class ModelFileInfo:
    """What a GGUF file says about the model inside it."""

    path: Path
    size_bytes: int
    architecture: str
    parameter_count: int
    quantization: str
    context_length: int | None
    chat_template: str | None
    name: str | None
    tensor_count: int = 0
    gguf_version: int = 3
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)  # scalar keys only

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)


class _Truncated(Exception):
    pass


class _Cursor:
    """Sequential little/big-endian reads over a buffer, raising _Truncated past its end."""

    def __init__(self, buf: Any, endian: str) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.endian = endian

    def unpack(self, fmt: str) -> Any:
        st = struct.Struct(self.endian + fmt)
        if self.pos + st.size > self.size:
            raise _Truncated
        (value,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return value

    def string(self) -> str:
        length = self.unpack("Q")
        if self.pos + length > self.size:
            raise _Truncated
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        st = struct.Struct(self.endian + "Q")
        buf, pos, size = self.buf, self.pos, self.size
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated
            pos += 8 + st.unpack_from(buf, pos)[0]
        if pos > size:
            raise _Truncated
        self.pos = pos

    def value(self, vtype: int, keep_arrays: bool = False) -> Any:
        """Read one metadata value; arrays are skipped (returned as their length) by default."""
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[vtype])
        if vtype == GGUFValueType.ARRAY:
            item_type = self.unpack("I")
            count = self.unpack("Q")
            if count > _MAX_COUNT:
                raise InvalidModelFile(f"implausible array length {count} in metadata")
            if keep_arrays:
                return [self.value(item_type) for _ in range(count)]
            if item_type == GGUFValueType.STRING:
                self.skip_strings(count)
            elif item_type in _SCALAR_FORMATS:
                self.pos += count * struct.calcsize(_SCALAR_FORMATS[item_type])
                if self.pos > self.size:
                    raise _Truncated
            else:
                for _ in range(count):
                    self.value(item_type)
            return count
        raise InvalidModelFile(f"unknown metadata value type {vtype}")


def _quant_name(file_type: int | None, tensor_types: Counter[str]) -> str:
    if file_type is not None and file_type != LlamaFileType.GUESSED:
        try:
            name = LlamaFileType(file_type).name
        except ValueError:
            name = ""
        if name:
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    if tensor_types:
        return tensor_types.most_common(1)[0][0]
    return "unknown"


def _human_error(path: Path, exc: OSError) -> InvalidModelFile:
    return InvalidModelFile(f"cannot read {path}: {exc.strerror or exc}")


def read_model_file(path: str | Path) -> ModelFileInfo:
    """Read a GGUF's metadata; raise InvalidModelFile if it is not a complete GGUF model."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise InvalidModelFile(f"{path} is not a regular file")
        if size == 0:
            raise InvalidModelFile(f"{path} is empty, not a GGUF model file")
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(path, size, buf)
    except FileNotFoundError as exc:
        raise InvalidModelFile(f"{path} does not exist") from exc
    except OSError as exc:
        raise _human_error(path, exc) from exc


def _parse(path: Path, size: int, buf: Any) -> ModelFileInfo:
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise InvalidModelFile(
            f"{path} is not a GGUF model file (expected magic bytes 'GGUF', "
            f"found {bytes(buf[:4])!r})"
        )
    cur = _Cursor(buf, "<")
    cur.pos = 4
    try:
        version = cur.unpack("I")
        if version & 0xFFFF == 0 and version != 0:  # written big-endian
            cur.endian = ">"
            cur.pos = 4
            version = cur.unpack("I")
        if version not in (2, 3):
            raise InvalidModelFile(f"{path}: unsupported GGUF version {version} (need 2 or 3)")
        n_tensors = cur.unpack("Q")
        n_kv = cur.unpack("Q")
        if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
            raise InvalidModelFile(f"{path}: corrupt GGUF header (implausible counts)")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.unpack("I")
            value = cur.value(vtype)
            if vtype != GGUFValueType.ARRAY:
                metadata[key] = value
        tensors: list[tuple[str, int, int, int]] = []  # name, n_elements, type, offset
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("I")
            if n_dims > 8:
                raise InvalidModelFile(f"{path}: corrupt tensor info for {name!r}")
            n_elements = 1
            for _ in range(n_dims):
                n_elements *= cur.unpack("Q")
            ttype = cur.unpack("I")
            offset = cur.unpack("Q")
            tensors.append((name, n_elements, ttype, offset))
    except _Truncated as exc:
        raise InvalidModelFile(
            f"{path} is truncated: its GGUF header runs past the end of the file ({size} bytes)"
        ) from exc

    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_offset = -(-cur.pos // alignment) * alignment
    return _summarise(path, size, version, metadata, tensors, data_offset)


def _summarise(
    path: Path,
    size: int,
    version: int,
    metadata: dict[str, Any],
    tensors: list[tuple[str, int, int, int]],
    data_offset: int,
) -> ModelFileInfo:
    if not tensors:
        raise InvalidModelFile(f"{path} contains no tensors (vocabulary-only GGUF?)")
    needed = data_offset
    params = 0
    by_type: Counter[str] = Counter()
    for name, n_elements, ttype, offset in tensors:
        try:
            qtype = GGMLQuantizationType(ttype)
            block_size, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError) as exc:
            raise InvalidModelFile(f"{path}: tensor {name!r} has unknown type {ttype}") from exc
        n_bytes = n_elements * type_size // block_size
        needed = max(needed, data_offset + offset + n_bytes)
        params += n_elements
        if n_elements > 0 and not name.endswith((".bias", "_norm.weight", "norm.weight")):
            by_type[qtype.name] += n_elements
    if needed > size:
        raise InvalidModelFile(
            f"{path} is truncated: its tensors need {needed} bytes but the file has only "
            f"{size} ({(needed - size) * 100 // needed}% missing)"
        )
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InvalidModelFile(f"{path}: GGUF has no general.architecture; not a model file")
    ctx = metadata.get(f"{arch}.context_length")
    file_type = metadata.get("general.file_type")
    template = metadata.get("tokenizer.chat_template")
    model_name = metadata.get("general.name")
    return ModelFileInfo(
        path=path,
        size_bytes=size,
        architecture=arch,
        parameter_count=params,
        quantization=_quant_name(file_type if isinstance(file_type, int) else None, by_type),
        context_length=int(ctx) if isinstance(ctx, int) else None,
        chat_template=template if isinstance(template, str) and template else None,
        name=model_name if isinstance(model_name, str) else None,
        tensor_count=len(tensors),
        gguf_version=version,
        metadata=metadata,
    )


def format_params(count: int) -> str:
    """135_000_000 -> '135M'; 1_500_000_000 -> '1.5B'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            value = count / scale
            return f"{value:.0f}{unit}" if value >= 10 else f"{value:.1f}{unit}"
    return str(count)


def format_size(n_bytes: int) -> str:
    """Bytes as a short human string (MiB/GiB)."""
    size = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
