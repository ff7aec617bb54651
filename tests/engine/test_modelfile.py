"""GGUF metadata reading and refusal of non-GGUF / truncated files."""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from chatbox.catalog.gguf import (
    InvalidModelFile,
    format_params,
    format_size,
    read_model_file,
)


def _truncate(src: Path, dest: Path, keep: int) -> Path:
    dest.write_bytes(src.read_bytes()[:keep])
    return dest


def test_tiny_model_metadata(tiny_gguf: Path) -> None:
    info = read_model_file(tiny_gguf)
    assert info.architecture == "llama"
    assert info.name == "tiny-test-llama"
    assert info.context_length == 4096
    assert info.quantization == "F32"
    assert info.has_chat_template and "<|im_start|>" in (info.chat_template or "")
    assert info.size_bytes == tiny_gguf.stat().st_size
    reader = gguf.GGUFReader(tiny_gguf)
    assert info.tensor_count == len(reader.tensors)
    assert info.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert info.metadata["llama.block_count"] == 2


def test_real_default_model(smollm2_gguf: Path) -> None:
    start = time.perf_counter()
    info = read_model_file(smollm2_gguf)
    assert time.perf_counter() - start < 2.0  # header only; GGUFReader takes seconds here
    assert info.architecture == "llama"
    assert info.quantization == "Q4_1"
    assert info.context_length == 8192
    assert info.parameter_count == 134_515_008
    assert format_params(info.parameter_count) == "135M"
    assert info.has_chat_template


@pytest.mark.parametrize("fraction", [0.001, 0.02, 0.5, 0.9999])
def test_truncated_file_is_refused(tiny_gguf: Path, tmp_path: Path, fraction: float) -> None:
    size = tiny_gguf.stat().st_size
    bad = _truncate(tiny_gguf, tmp_path / "cut.gguf", max(8, int(size * fraction)))
    with pytest.raises(InvalidModelFile, match="truncated"):
        read_model_file(bad)


def test_truncated_real_model_is_refused(smollm2_gguf: Path, tmp_path: Path) -> None:
    with smollm2_gguf.open("rb") as fh:
        head = fh.read(5_000_000)
    bad = tmp_path / "half.gguf"
    bad.write_bytes(head)
    with pytest.raises(InvalidModelFile, match="truncated"):
        read_model_file(bad)


def test_non_gguf_empty_missing_and_directory(tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("definitely not a model\n")
    with pytest.raises(InvalidModelFile, match="not a GGUF"):
        read_model_file(text)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(InvalidModelFile, match="empty"):
        read_model_file(empty)
    with pytest.raises(InvalidModelFile, match="does not exist"):
        read_model_file(tmp_path / "nope.gguf")
    with pytest.raises(InvalidModelFile, match="not a regular file"):
        read_model_file(tmp_path)


def test_bad_version_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "v9.gguf"
    bad.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + bytes(16))
    with pytest.raises(InvalidModelFile, match="version"):
        read_model_file(bad)


def test_no_tensors_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InvalidModelFile, match="no tensors"):
        read_model_file(path)


def test_quantization_from_dominant_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "f16.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")  # no general.file_type, no context length
    w.add_tensor("token_embd.weight", np.zeros((32, 16), dtype=np.float16))
    w.add_tensor("output_norm.weight", np.ones(16, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = read_model_file(path)
    assert info.quantization == "F16"
    assert info.architecture == "gpt2"
    assert info.context_length is None
    assert info.chat_template is None
    assert info.parameter_count == 32 * 16 + 16


def test_formatting() -> None:
    assert format_params(134_515_008) == "135M"
    assert format_params(1_500_000_000) == "1.5B"
    assert format_params(268_000_000) == "268M"
    assert format_params(999) == "999"
    assert format_size(98_362_432) == "93.8 MiB"
    assert format_size(512) == "512 B"
