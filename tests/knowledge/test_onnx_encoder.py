"""The ONNX Runtime encoder: the same vectors as sentence-transformers, exported once."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chatbox.knowledge.embedder import Embedder, default_model_path
from chatbox.knowledge.onnx_encoder import (
    OnnxEncoder,
    cached_onnx_encoder,
    checked_file,
    graph_file,
    onnx_encoder,
    quantized_encoder,
    run_options,
    split_encoder,
)

pytest.importorskip("onnxruntime")

TEXTS = [
    "hi",
    "Llamas are kept for their wool, which is spun into yarn and sold at markets.",
    "Le lama est un animal domestique des Andes; il porte des charges légères.",
    "def add(a, b):\n    return a + b  # code is text too",
    "word " * 400,  # longer than the model reads: truncated the same way
]

pytestmark = pytest.mark.store_agnostic("the encoder's vectors and its cached graphs")


@pytest.fixture(scope="module")
def st_model() -> object:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(default_model_path()), device="cpu", local_files_only=True)


@pytest.fixture(scope="module")
def exported(st_model: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the exported graph, checked against torch (the tests that start from
    one copy it: an export costs seconds of CPU)."""
    cache = tmp_path_factory.mktemp("exported")
    assert onnx_encoder(st_model, default_model_path(), cache, threads=1) is not None
    return cache


@pytest.fixture(scope="module")
def prepared(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding everything a start makes: the graph, its int8 copy and its halves."""
    cache = tmp_path_factory.mktemp("prepared")
    shutil.copytree(exported, cache, dirs_exist_ok=True)

    async def load() -> None:
        embedder = Embedder(onnx_cache=cache)
        try:
            await embedder.load(approximate=True)
        finally:
            embedder.close()

    asyncio.run(load())
    return cache


def copy_of(cache: Path, into: Path) -> Path:
    shutil.copytree(cache, into, dirs_exist_ok=True)
    return into


def test_vectors_match_sentence_transformers_and_the_graph_is_cached(
    st_model: object, tmp_path: Path
) -> None:
    encoder = onnx_encoder(st_model, default_model_path(), tmp_path, threads=1)
    assert isinstance(encoder, OnnxEncoder)
    path = graph_file(tmp_path, default_model_path())
    assert path.exists()
    expected = st_model.encode(TEXTS, normalize_embeddings=True)  # type: ignore[attr-defined]
    got = encoder.encode(TEXTS)  # one padded batch
    assert got.shape == (len(TEXTS), 384)
    assert np.abs(got - expected).max() < 1e-4
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # One at a time gives the same vector as in a padded batch.
    assert np.abs(encoder.encode([TEXTS[1]])[0] - got[1]).max() < 1e-5

    stamp = path.stat().st_mtime_ns
    again = onnx_encoder(st_model, default_model_path(), tmp_path, threads=1)
    assert again is not None and path.stat().st_mtime_ns == stamp  # reused, not re-exported


def test_a_damaged_cached_graph_is_exported_again(
    st_model: object, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = graph_file(tmp_path, default_model_path())
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x08\x01half a graph, as a crash would leave it")
    with caplog.at_level(logging.WARNING, "chatbox.knowledge"):
        encoder = onnx_encoder(st_model, default_model_path(), tmp_path, threads=1)
    assert encoder is not None
    assert "unusable" in caplog.text
    expected = st_model.encode(TEXTS[:2], normalize_embeddings=True)  # type: ignore[attr-defined]
    assert np.abs(encoder.encode(TEXTS[:2]) - expected).max() < 1e-4


def test_a_model_pooled_otherwise_stays_in_torch(st_model: object, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling

    modules = list(st_model)  # type: ignore[call-overload]
    cls_pooled = SentenceTransformer(modules=[modules[0], Pooling(384, pooling_mode="cls")])
    assert onnx_encoder(cls_pooled, default_model_path(), tmp_path, threads=1) is None
    assert not graph_file(tmp_path, default_model_path()).exists()


def test_embedder_on_onnx_gives_the_vectors_torch_gives(tmp_path: Path) -> None:
    async def both() -> tuple[np.ndarray, np.ndarray, object]:
        fast, plain = Embedder(onnx_cache=tmp_path), Embedder()
        try:
            a = await fast.embed(TEXTS, urgent=True)
            b = await plain.embed(TEXTS)
            return a, b, fast._urgent.model
        finally:
            fast.close()
            plain.close()

    a, b, model = asyncio.run(both())
    assert isinstance(model, OnnxEncoder)
    assert np.abs(a - b).max() < 1e-4


def exact_and_int8(st_model: object, cache: Path) -> tuple[OnnxEncoder, OnnxEncoder]:
    """The exported graph and its int8 copy, made in `cache`."""
    exact = onnx_encoder(st_model, default_model_path(), cache, threads=1)
    assert exact is not None
    quick = quantized_encoder(exact, threads=1)
    assert quick is not None and quick.path is not None and quick.path.name.endswith("-int8.onnx")
    return exact, quick


def test_the_int8_copy_is_close_cached_and_remade_when_damaged(
    st_model: object, exported: Path, tmp_path: Path
) -> None:
    exact, quick = exact_and_int8(st_model, copy_of(exported, tmp_path))
    assert quick.path is not None
    # a quarter of the graph's size: its weights are int8
    assert (
        quick.path.stat().st_size < 0.4 * graph_file(tmp_path, default_model_path()).stat().st_size
    )
    a, b = exact.encode(TEXTS), quick.encode(TEXTS)
    assert np.abs(a - b).max() > 1e-4  # another graph, not the same one twice
    assert ((a * b).sum(axis=1) > 0.97).all()
    stamp = quick.path.stat().st_mtime_ns
    again = quantized_encoder(exact, threads=1)
    assert again is not None and again.path == quick.path
    assert quick.path.stat().st_mtime_ns == stamp  # reused

    # What a crash mid-write could not leave (it is written aside, then renamed), but a disk could.
    quick.path.write_bytes(b"half a graph")
    assert quantized_encoder(exact, threads=1) is None  # this start uses the exact graph
    assert not quick.path.exists()  # and the next makes it again
    remade = quantized_encoder(exact, threads=1)
    assert remade is not None and ((remade.encode(TEXTS) * a).sum(axis=1) > 0.97).all()


def test_the_int8_graph_cut_in_two_adds_up_to_it_and_is_cached(
    st_model: object, exported: Path, tmp_path: Path
) -> None:
    _, quick = exact_and_int8(st_model, copy_of(exported, tmp_path))
    assert quick.path is not None
    split = split_encoder(quick, 3, threads=1)
    assert split is not None
    # what a classifier of its vectors at the cut is named by: the graph and the runtime
    assert "-int8-front3.onnx onnxruntime " in split.key
    for text in TEXTS:
        early, partial = split.front(text)
        whole = quick.encode([text])[0]
        assert np.abs(split.back(partial) - whole).max() < 1e-5  # the same arithmetic
        assert early.shape == (384,) and abs(float(np.linalg.norm(early)) - 1) < 1e-5
        assert float(early @ whole) < 0.99  # read half-way: not yet the whole vector
    parts = sorted(quick.path.parent.glob(f"{quick.path.stem}-*3.onnx"))
    assert [p.name.rsplit("-", 1)[1] for p in parts] == ["back3.onnx", "front3.onnx"]
    stamps = [p.stat().st_mtime_ns for p in parts]
    reused = split_encoder(quick, 3, threads=1)
    assert reused is not None and reused.cut == split.cut  # read from the cached parts
    assert [p.stat().st_mtime_ns for p in parts] == stamps  # reused

    assert split_encoder(quick, 7, threads=1) is None  # MiniLM has six layers: no such cut
    parts[0].write_bytes(b"half a graph")  # what a disk could leave
    assert split_encoder(quick, 3, threads=1) is None  # windows are embedded whole this start
    assert not any(p.exists() for p in parts)  # and the next start cuts it again
    again = split_encoder(quick, 3, threads=1)
    assert again is not None
    _, partial = again.front(TEXTS[1])
    assert np.abs(again.back(partial) - quick.encode([TEXTS[1]])[0]).max() < 1e-5


def test_screened_vectors_stop_at_the_cut_unless_kept(prepared: Path, tmp_path: Path) -> None:
    seen: list[np.ndarray] = []

    def keep_long(vector: np.ndarray) -> bool:
        seen.append(vector)
        return len(seen) % 2 == 0  # every second text goes on

    async def run() -> tuple[np.ndarray, np.ndarray, list[bool], np.ndarray, list[bool]]:
        embedder = Embedder(onnx_cache=copy_of(prepared, tmp_path))
        try:
            quick = await embedder.embed(TEXTS, approximate=True)
            assert embedder.screens
            mixed, whole = await embedder.embed_screened(TEXTS, keep_long)
            early, none = await embedder.embed_screened(TEXTS, lambda v: False)
            return quick, mixed, whole, early, none
        finally:
            embedder.close()

    quick, mixed, whole, early, none = asyncio.run(run())
    assert whole == [i % 2 == 1 for i in range(len(TEXTS))] and not any(none)
    assert len(seen) == len(TEXTS) and all(v.shape == (384,) for v in seen)
    for i, finished in enumerate(whole):
        # a kept text gets the vector embed(approximate=True) gives; the rest their early one
        expected = quick[i] if finished else early[i]
        assert np.abs(mixed[i] - expected).max() < 1e-5
    assert np.abs(early - quick).max() > 1e-2


def test_approximate_vectors_come_from_the_int8_copy_only(prepared: Path, tmp_path: Path) -> None:
    async def run() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        embedder = Embedder(onnx_cache=copy_of(prepared, tmp_path))
        try:
            exact = await embedder.embed(TEXTS)
            quick = await embedder.embed(TEXTS, approximate=True)
            urgent = await embedder.embed(TEXTS, urgent=True)
            alone = await embedder.embed(TEXTS[1:2], approximate=True)
            return exact, quick, urgent, alone
        finally:
            embedder.close()

    exact, quick, urgent, alone = asyncio.run(run())
    # a text's approximate vector does not depend on what it was asked with
    assert np.abs(alone[0] - quick[1]).max() < 1e-6
    assert np.abs(exact - urgent).max() < 1e-5  # what is stored is always exact
    assert np.abs(exact - quick).max() > 1e-4
    assert ((exact * quick).sum(axis=1) > 0.97).all()


def test_an_unknown_runtime_is_refused_at_start() -> None:
    from chatbox.settings import settings_from_env

    assert settings_from_env({"CHATBOX_EMBEDDING_RUNTIME": "torch"}).embedding_runtime == "torch"
    with pytest.raises(ValueError, match="embedding_runtime must be one of onnx, torch"):
        settings_from_env({"CHATBOX_EMBEDDING_RUNTIME": "onxx"})


def test_a_graph_checked_once_loads_without_torch(
    st_model: object, exported: Path, tmp_path: Path
) -> None:
    # the first start exported the graph and checked it against torch (`exported`)...
    copy_of(exported, tmp_path)
    script = (
        "import asyncio, json, sys\n"
        "from pathlib import Path\n"
        "from chatbox.knowledge.embedder import Embedder\n"
        "async def main():\n"
        f"    e = Embedder(onnx_cache=Path({str(tmp_path)!r}))\n"
        "    try:\n"
        f"        v = await e.embed({TEXTS!r}, urgent=True)\n"
        "        await e.load(approximate=True)\n"
        "    finally:\n"
        "        e.close()\n"
        "    return v\n"
        "v = asyncio.run(main())\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'v': v.tolist()}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # ...and a later start (a new process) runs it without importing torch at all
    assert got["torch"] is False, done.stderr[-2000:]
    expected = st_model.encode(TEXTS, normalize_embeddings=True)  # type: ignore[attr-defined]
    assert np.abs(np.asarray(got["v"]) - expected).max() < 1e-4


def test_a_graph_checked_against_vectors_that_moved_goes_back_through_torch(
    exported: Path, tmp_path: Path
) -> None:
    copy_of(exported, tmp_path)
    record = checked_file(graph_file(tmp_path, default_model_path()))
    meta = json.loads(record.read_text())
    meta["vectors"][0][0] += 0.5  # torch's vectors, as another version would give them
    record.write_text(json.dumps(meta))
    assert cached_onnx_encoder(default_model_path(), tmp_path, threads=1) is None
    assert not record.exists()  # the torch path checks the graph again and writes it anew


def test_both_lanes_run_one_copy_of_each_graph(prepared: Path, tmp_path: Path) -> None:
    async def loaded() -> Embedder:
        e = Embedder(onnx_cache=copy_of(prepared, tmp_path))
        await e.load(approximate=True)
        return e

    e = asyncio.run(loaded())
    try:
        urgent, background = e._urgent.model, e._background.model
        assert isinstance(urgent, OnnxEncoder) and isinstance(background, OnnxEncoder)
        assert urgent.session is background.session  # one copy of the weights
        assert urgent.tokenizer is not background.tokenizer  # a tokenizer per lane's thread
        quick = e._background.quick
        assert isinstance(quick, OnnxEncoder) and e._urgent.quick is not None
        assert e._urgent.quick.session is quick.session  # the int8 copy: one session too
        # the breakdown counts each shared graph once
        memory = e.memory()
        assert memory["embeddings: exact graph"] == _file_bytes(urgent)
        assert memory["embeddings: int8 copy"] == _file_bytes(quick) < _file_bytes(urgent)
        assert "embeddings: int8 halves" in memory
    finally:
        e.close()


def _file_bytes(encoder: OnnxEncoder) -> int:
    assert encoder.path is not None
    return encoder.path.stat().st_size


def test_every_run_gives_its_arena_growth_back() -> None:
    # a batch of long texts grows ONNX Runtime's arena by ~300 MB; it is given back after
    # the run instead of staying resident (the memory breakdown's heap row)
    options = run_options()
    assert options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
