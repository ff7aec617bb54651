"""The embedding model run by ONNX Runtime instead of torch: the same vectors, sooner.

A message is a dozen tokens, and torch's eager forward of MiniLM spends most of its time on
it in per-operator dispatch and unfused kernels, which ONNX Runtime's graph optimiser removes
(fused attention, layer norm and GELU: ~5 ms a message on one core). That is what keeps a message's
moderation check inside its budget while answers decode on the same cores.

The graph is exported once from the sentence-transformers files (torch's exporter), cached
under the cache directory, and checked against torch before it is used: if its vectors do
not match (another architecture, a pooling other than the mean, an exporter change), the
embedder keeps torch and says so. Tokenising, mean pooling and normalising are done here,
as sentence-transformers does them. The check's vectors are kept beside the graph, so a
later start loads the graph with the `tokenizers` library alone and checks it against them:
the server never imports torch once the graph exists (`cached_onnx_encoder`).

Moderation alone may use a copy with int8 weights (`quantized_encoder`): about twice as fast
again, with vectors within cosine 0.97 of the exact ones, so the category classifier meets
the same held-out targets (docs/moderation.md). Its vectors are never stored: memory,
documents, search and the embeddings API keep the exact graph.

Answer windows go one step further (`split_encoder`): the int8 graph is cut after its third
of six layers into two graphs that together compute exactly what it does. The first gives a
vector where it is cut (mean-pooled, like the last); a cheap screen scores that vector, and
only a text the screen finds anything in goes on through the other three layers.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("chatbox.knowledge")
EXPORT_VERSION = 1  # bump when the export below changes: cached graphs are then rebuilt
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PROBES = (  # padded in one batch, so masking is checked too
    "hello",
    "A longer sentence, with punctuation; numbers like 4721 and a name: Ada Lovelace.",
    "Ünïcödé and emoji 🙂 survive tokenising.",
)
TOLERANCE = 1e-4  # largest difference allowed from torch's vector, per component
QUANTIZED_MIN_COSINE = 0.97  # the int8 copy's vectors against the exact ones, on PROBES
SPLIT_TOLERANCE = 1e-5  # a split graph's vectors against the whole one's (the same arithmetic)


class OnnxEncoder:
    """Texts → unit vectors through an ONNX Runtime session (mean pooling, like the model)."""

    def __init__(
        self, session: Any, tokenizer: Any, max_seq_length: int, path: Path | None = None
    ) -> None:
        self.session = session
        self.path = path  # the graph file the session runs
        self.tokenizer = tokenizer  # one per thread: a fast tokenizer is not thread-safe
        self.max_seq_length = max_seq_length
        self._inputs = [i.name for i in session.get_inputs()]

    def tokenized(self, texts: list[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The graph's inputs for texts (padded to the longest) and their attention mask."""
        batch = self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="np",
        )
        feeds = {name: np.asarray(batch[name], dtype=np.int64) for name in self._inputs}
        return feeds, np.asarray(batch["attention_mask"])

    def encode(self, texts: list[str]) -> np.ndarray:
        feeds, mask = self.tokenized(texts)
        return _pooled(self.session.run(None, feeds, run_options())[0], mask)


_RUN: list[Any] = []


def run_options() -> Any:
    """Options of every run: the arena gives back what a run took beyond its first chunk.
    Otherwise one batch of long texts (an upload, a classifier's training set) keeps
    ~300 MB resident for good; a message's run allocates too little to notice."""
    if not _RUN:
        import onnxruntime as ort

        options = ort.RunOptions()
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        _RUN.append(options)
    return _RUN[0]


def _pooled(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean over the real tokens, as unit vectors (what sentence-transformers computes)."""
    mask = np.asarray(attention_mask, dtype=np.float32)[..., None]
    pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    unit: np.ndarray = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
    return unit


@dataclass
class Partial:
    """A text part-way through a split graph: its inputs and the hidden states at the cut."""

    feeds: dict[str, np.ndarray]
    mask: np.ndarray  # the tokenizer's attention mask (what the pooling averages over)
    hidden: np.ndarray


class SplitEncoder:
    """A graph cut in two (`split_encoder`): `front` gives a text's vector at the cut and
    what `back` needs to finish it; `back` gives the vector the whole graph would."""

    def __init__(self, front: Any, back: Any, cut: str, whole: OnnxEncoder, key: str) -> None:
        self._front, self._back, self.cut = front, back, cut
        self.key = key  # names the graph and runtime that make its vectors at the cut
        self._whole = whole  # its tokenizer (the lane's own) and inputs are the front's
        self._back_inputs = [i.name for i in back.get_inputs() if i.name != cut]

    def front(self, text: str) -> tuple[np.ndarray, Partial]:
        feeds, mask = self._whole.tokenized([text])
        hidden: np.ndarray = self._front.run(None, feeds, run_options())[0]
        return _pooled(hidden, mask)[0], Partial(feeds, mask, hidden)

    def back(self, partial: Partial) -> np.ndarray:
        feeds = {name: partial.feeds[name] for name in self._back_inputs}
        hidden: np.ndarray = self._back.run(
            None, {**feeds, self.cut: partial.hidden}, run_options()
        )[0]
        vector: np.ndarray = _pooled(hidden, partial.mask)[0]
        return vector


class TextTokenizer:
    """A model's `tokenizer.json` run by the `tokenizers` library, called as the
    transformers tokenizer is here (padded batches of ids, masks and type ids; plain ids
    for counting), without importing transformers or torch. Not shared between threads."""

    model_input_names = list(INPUTS)

    def __init__(self, path: Path, max_length: int) -> None:
        from tokenizers import Tokenizer

        self._plain = Tokenizer.from_file(str(path))
        self._plain.no_truncation()
        self._plain.no_padding()
        pad = Tokenizer.from_file(str(path)).padding or {}
        self._batch = Tokenizer.from_file(str(path))
        self._batch.enable_truncation(max_length)
        # padded to the batch's longest text (the file may ask a fixed length)
        self._batch.enable_padding(
            pad_id=int(pad.get("pad_id", 0)),
            pad_type_id=int(pad.get("pad_type_id", 0)),
            pad_token=str(pad.get("pad_token", "[PAD]")),
        )

    def __call__(
        self,
        texts: list[str],
        padding: bool = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
        add_special_tokens: bool = True,
    ) -> dict[str, Any]:
        tok = self._batch if (padding or truncation) else self._plain
        rows = tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        out: dict[str, Any] = {
            "input_ids": [r.ids for r in rows],
            "attention_mask": [r.attention_mask for r in rows],
            "token_type_ids": [r.type_ids for r in rows],
        }
        if return_tensors == "np":
            return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}
        return out


def _version(dist: str) -> str:
    """An installed distribution's version, read without importing it."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def graph_file(cache_dir: Path, model_path: Path) -> Path:
    """Where the exported graph lives: named by the model and the versions that made it."""
    config = model_path / "config.json"
    key = "|".join(
        (
            str(model_path.resolve()),
            config.read_text() if config.exists() else "",
            _version("torch"),
            _version("transformers"),
            str(EXPORT_VERSION),
        )
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / "embeddings" / f"{model_path.name}-{digest}.onnx"


def _mean_pooled(st_model: Any) -> bool:
    """Whether the model is a plain transformer with mean pooling (what `encode` does)."""
    modules = list(st_model)
    if len(modules) < 2 or type(modules[0]).__name__ != "Transformer":
        return False
    pooling = modules[1].get_config_dict() if hasattr(modules[1], "get_config_dict") else {}
    rest = {type(m).__name__ for m in modules[2:]}
    return pooling.get("pooling_mode") == "mean" and rest <= {"Normalize"}


def _export(st_model: Any, path: Path) -> None:
    """Write the transformer's graph to path, crash-safe (a partial file is never used)."""
    import torch

    hf = st_model[0].auto_model
    names = [n for n in INPUTS if n in st_model.tokenizer.model_input_names]

    class Hidden(torch.nn.Module):  # keyword inputs in, the last hidden state out
        def __init__(self) -> None:
            super().__init__()
            self.model = hf

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.model(**dict(zip(names, args, strict=True))).last_hidden_state
            return out

    sample = st_model.tokenizer(list(PROBES[:2]), padding=True, return_tensors="pt")
    axes = {n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with warnings.catch_warnings(), torch.inference_mode(), _removed_on_error(tmp):
        warnings.simplefilter("ignore")  # the exporter's notes on tracing and deprecations
        torch.onnx.export(
            Hidden(),
            tuple(sample[n] for n in names),
            str(tmp),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    tmp.replace(path)


@contextmanager
def _removed_on_error(path: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        path.unlink(missing_ok=True)
        raise


class _FromQuantiser(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname


def quantized_encoder(exact: OnnxEncoder, threads: int) -> OnnxEncoder | None:
    """An int8 copy of exact's graph (weights per channel, activations quantised as they
    run), or None if it cannot be made or its vectors stray from `exact`'s."""
    if exact.path is None:
        return None
    path = exact.path
    target = path.with_name(f"{path.stem}-int8.onnx")
    try:
        if not target.exists():
            from onnxruntime.quantization import QuantType, quantize_dynamic

            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            # The quantiser logs a suggestion to pre-process the graph on the root logger:
            # that note (only the quantiser's) is dropped while it runs.
            root, notes = logging.getLogger(), _FromQuantiser()
            root.addFilter(notes)
            try:
                with warnings.catch_warnings(), _removed_on_error(tmp):
                    warnings.simplefilter("ignore")
                    quantize_dynamic(
                        str(path), str(tmp), per_channel=True, weight_type=QuantType.QInt8
                    )
            finally:
                root.removeFilter(notes)
            tmp.replace(target)
        encoder = OnnxEncoder(
            _session(target, threads), exact.tokenizer, exact.max_seq_length, target
        )
        cosine = (encoder.encode(list(PROBES)) * exact.encode(list(PROBES))).sum(axis=1)
    except Exception as exc:  # costs moderation speed, never its answers
        log.warning("moderation uses the exact embedding graph: int8 copy failed (%s)", exc)
        target.unlink(missing_ok=True)
        return None
    if float(cosine.min()) < QUANTIZED_MIN_COSINE:
        log.warning("moderation uses the exact embedding graph: the int8 copy's vectors differ")
        return None
    return encoder


def _cut_graph(path: Path, parts: list[Path], layers: int) -> str | None:
    """Write path's graph as two parts cut after `layers` transformer layers; the name of
    the tensor at the cut (None: no cut there). Needs the onnx package, which a start that
    finds both parts cached never imports (~12 MB of a process)."""
    import onnx
    import onnx.utils

    graph = onnx.load(str(path), load_external_data=False).graph
    # The exporter names nodes by module path: layer i's last LayerNorm ends it.
    ends = f"layer.{layers - 1}/output/LayerNorm"
    cut: str | None = next(
        (
            str(n.output[0])
            for n in graph.node
            if n.op_type == "LayerNormalization" and ends in n.name
        ),
        None,
    )
    if cut is None:
        return None
    inputs = [i.name for i in graph.input]
    outputs = [o.name for o in graph.output]
    for part, ins, outs in ((parts[0], inputs, [cut]), (parts[1], [cut, *inputs], outputs)):
        if not part.exists():
            tmp = part.with_suffix(f".{os.getpid()}.tmp")
            with _removed_on_error(tmp):
                onnx.utils.extract_model(str(path), str(tmp), ins, outs)
            tmp.replace(part)
    return cut


def split_encoder(whole: OnnxEncoder, layers: int, threads: int) -> SplitEncoder | None:
    """`whole`'s graph cut after its first `layers` transformer layers (the two parts cached
    beside it), or None where it cannot be cut there or the parts do not add up to it."""
    if whole.path is None:
        return None
    path = whole.path
    parts = [path.with_name(f"{path.stem}-{part}{layers}.onnx") for part in ("front", "back")]
    try:
        if all(part.exists() for part in parts):
            sessions = _session(parts[0], threads), _session(parts[1], threads)
            front_inputs = {i.name for i in sessions[0].get_inputs()}
            cut = next(str(i.name) for i in sessions[1].get_inputs() if i.name not in front_inputs)
        else:
            made = _cut_graph(path, parts, layers)
            if made is None:
                log.info("answer windows are embedded whole: no cut after layer %d", layers)
                return None
            cut = made
            sessions = _session(parts[0], threads), _session(parts[1], threads)
        import onnxruntime

        key = f"{parts[0].name} onnxruntime {onnxruntime.__version__}"
        split = SplitEncoder(*sessions, cut, whole, key)
        for text in PROBES:
            _, partial = split.front(text)
            error = float(np.abs(split.back(partial) - whole.encode([text])[0]).max())
            if error > SPLIT_TOLERANCE:
                raise ValueError("its parts' vectors differ from the whole graph's")
    except Exception as exc:  # costs moderation speed, never its answers
        log.warning("answer windows are embedded whole: the split graph failed (%s)", exc)
        for part in parts:
            part.unlink(missing_ok=True)
        return None
    return split


def checked_file(graph: Path) -> Path:
    """Beside a graph: torch's vectors for PROBES and the model's token limit, written once
    the graph's vectors matched them."""
    return graph.with_suffix(".checked.json")


def _record_check(graph: Path, expected: np.ndarray, max_seq_length: int) -> None:
    record = checked_file(graph)
    tmp = record.with_suffix(f".{os.getpid()}.tmp")
    with _removed_on_error(tmp):
        tmp.write_text(json.dumps({"max_seq_length": max_seq_length, "vectors": expected.tolist()}))
    tmp.replace(record)


def cached_onnx_encoder(model_path: Path, cache_dir: Path, threads: int) -> OnnxEncoder | None:
    """The graph an earlier start exported and checked against torch, loaded without torch
    and checked again against the vectors torch gave then; None where there is none or it
    does not match (the caller then takes the torch path)."""
    path = graph_file(cache_dir, model_path)
    record = checked_file(path)
    if not (path.exists() and record.exists() and (model_path / "tokenizer.json").exists()):
        return None
    try:
        meta = json.loads(record.read_text())
        limit = int(meta["max_seq_length"])
        expected = np.asarray(meta["vectors"], dtype=np.float32)
        tokenizer = TextTokenizer(model_path / "tokenizer.json", limit)
        encoder = OnnxEncoder(_session(path, threads), tokenizer, limit, path)
        got = encoder.encode(list(PROBES))
    except Exception as exc:  # a damaged file: the torch path exports and checks it again
        log.warning("the cached ONNX graph %s is loaded through torch (%s)", path, exc)
        record.unlink(missing_ok=True)
        return None
    if got.shape != expected.shape or float(np.abs(got - expected).max()) > TOLERANCE:
        log.warning("the cached ONNX graph %s is loaded through torch: its vectors moved", path)
        record.unlink(missing_ok=True)
        return None
    return encoder


# One session per graph file and thread count: a session's run is safe from several threads
# at once, so the two lanes share one copy of the weights (each keeps its own tokenizer).
_SESSIONS: dict[tuple[str, int], tuple[int, Any]] = {}  # -> (the file's mtime, session)
_SESSIONS_LOCK = threading.Lock()


def _session(path: Path, threads: int) -> Any:
    key, stamp = (str(path.resolve()), threads), path.stat().st_mtime_ns
    with _SESSIONS_LOCK:
        held = _SESSIONS.get(key)
        if held is None or held[0] != stamp:  # a file written again is a new graph
            held = _SESSIONS[key] = (stamp, _new_session(path, threads))
        return held[1]


def _new_session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(threads, 0)
    options.inter_op_num_threads = 1
    # Spinning workers would take cores from the model's decode threads between encodes.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_encoder(
    st_model: Any, model_path: Path, cache_dir: Path, threads: int
) -> OnnxEncoder | None:
    """An ONNX Runtime encoder equal to st_model's vectors, or None (keep torch)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        log.info("onnxruntime is not installed: embeddings run in torch")
        return None
    if not _mean_pooled(st_model):
        log.info("embedding model is not mean-pooled: it runs in torch")
        return None
    path = graph_file(cache_dir, model_path)
    for attempt in ("cached", "exported"):
        if attempt == "exported" or not path.exists():
            try:
                _export(st_model, path)
            except Exception as exc:  # an export failure costs speed, never embeddings
                log.warning("embeddings stay in torch: the ONNX export failed (%s)", exc)
                return None
        try:
            encoder = OnnxEncoder(
                _session(path, threads), st_model.tokenizer, st_model.max_seq_length, path
            )
            got = encoder.encode(list(PROBES))
        except Exception as exc:  # a damaged cached file: export it again, once
            log.warning("the cached ONNX graph %s is unusable (%s)", path, exc)
            path.unlink(missing_ok=True)
            continue
        expected = st_model.encode(
            list(PROBES), convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
        )
        if got.shape == expected.shape and float(np.abs(got - expected).max()) <= TOLERANCE:
            _record_check(path, np.asarray(expected, dtype=np.float32), encoder.max_seq_length)
            return encoder
        log.warning("embeddings stay in torch: the ONNX graph's vectors differ from torch's")
        path.unlink(missing_ok=True)
        return None
    return None
