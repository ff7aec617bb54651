"""The category layer: logistic regression over MiniLM embeddings for the seven categories,
trained at first start on the labelled set in data/train.tsv (in a child process: the
server never imports scikit-learn) and cached as plain weights; and the labelled sets."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from chatbox.moderation.policy import CATEGORIES

DATA_DIR = Path(__file__).resolve().parent / "data"
TRAIN = DATA_DIR / "train.tsv"
HELDOUT = DATA_DIR / "heldout.tsv"
BENIGN = DATA_DIR / "benign.tsv"  # everyday requests, never trained on: false positives
LABELS = ("none", *CATEGORIES)
SEGMENT_CHARS = 800  # MiniLM reads 256 word pieces: longer text is scored in pieces
MAX_SEGMENTS = 64
# An answer window is finished past the cut (embedder.SCREEN_LAYERS) when the screen, a
# classifier on vectors at the cut, gives any category this much: low enough that no text
# of the held-out set or of SmolLM2's answers that the whole graph scores >= 0.6 in any
# category is stopped at the cut.
SCREEN_THRESHOLD = 0.15
SCREEN_FLOOR = 0.5  # a policy with a category threshold below this is not screened
FIT_TIMEOUT_S = 600
# The fit's inverse regularisation, chosen on benign.tsv's flagged rate and heldout.tsv's recall
# (docs/moderation.md#accuracy); part of the cached weights' name.
FIT_C = 16.0
log = logging.getLogger("chatbox.moderation")


def read_labelled(path: Path) -> list[tuple[str, str]]:
    """(label, text) pairs of a `label<TAB>text` file; `#` lines are comments."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        label, _, text = line.partition("\t")
        if label not in LABELS or not text.strip():
            raise ValueError(f"{path.name}:{n}: bad line")
        out.append((label, text.strip()))
    return out


def read_benign(path: Path = BENIGN) -> list[tuple[str, str]]:
    """(topic, text) pairs of the everyday requests that should never be flagged."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        topic, _, text = line.partition("\t")
        if not text.strip():
            raise ValueError(f"{path.name}:{n}: bad line")
        out.append((topic, text.strip()))
    return out


def segments(text: str) -> list[str]:
    """The pieces a long text is scored in (evenly spread past MAX_SEGMENTS)."""
    if len(text) <= SEGMENT_CHARS:
        return [text]
    starts = list(range(0, len(text), SEGMENT_CHARS))
    if len(starts) > MAX_SEGMENTS:
        step = len(starts) / MAX_SEGMENTS
        starts = [starts[int(i * step)] for i in range(MAX_SEGMENTS)]
    return [text[s : s + SEGMENT_CHARS] for s in starts]


class CategoryModel:
    """Multinomial logistic regression over LABELS, as plain weights (scored with numpy)."""

    def __init__(self, coef: np.ndarray, intercept: np.ndarray) -> None:
        self.coef = coef.astype(np.float32)  # (labels, 384)
        self.intercept = intercept.astype(np.float32)

    def probabilities(self, vectors: np.ndarray) -> np.ndarray:
        logits = vectors @ self.coef.T + self.intercept
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        out: np.ndarray = e / e.sum(axis=1, keepdims=True)
        return out

    def scores(self, vectors: np.ndarray) -> dict[str, float]:
        """Each category's highest probability over the rows (a text's segments)."""
        top = self.probabilities(vectors).max(axis=0)
        return {label: float(top[i]) for i, label in enumerate(LABELS) if label != "none"}

    def top(self, vector: np.ndarray) -> float:
        """One vector's highest probability of any category."""
        return float(self.probabilities(vector[None, :])[0, 1:].max())

    @classmethod
    def train(cls, vectors: np.ndarray, labels: Sequence[str]) -> CategoryModel:
        """Fit on the labelled vectors in a child process (`fit`), which alone imports
        scikit-learn (~70 MB a process keeps once it has)."""
        y = np.array([LABELS.index(label) for label in labels])
        with tempfile.TemporaryDirectory(prefix="chatbox-fit-") as tmp:
            given, fitted = Path(tmp) / "given.npz", Path(tmp) / "fitted.npz"
            np.savez(given, vectors=vectors, y=y)
            cmd = [sys.executable, "-m", "chatbox.moderation.classifier", str(given), str(fitted)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=FIT_TIMEOUT_S)
            if done.returncode != 0:
                raise RuntimeError(f"training the moderation classifier failed: {done.stderr}")
            return cls.load(fitted)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")  # servers starting together
        np.savez(tmp, coef=self.coef, intercept=self.intercept)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> CategoryModel:
        with np.load(path) as data:
            return cls(data["coef"], data["intercept"])


def model_file(
    cache_dir: Path, embedding_model: Path, kind: str = "categories", vectors: str = ""
) -> Path:
    """Where the trained weights live: named by the training set, the embedding model and
    what else its vectors depend on (`kind`: "categories", or the screen's)."""
    key = TRAIN.read_bytes() + str(embedding_model).encode() + f"|C={FIT_C}".encode()
    if vectors:
        key += f"|{vectors}".encode()
    digest = hashlib.sha256(key).hexdigest()
    return cache_dir / "moderation" / f"{kind}-{digest[:16]}.npz"


def fit(given: Path, fitted: Path) -> None:
    """The child's work: logistic regression on the vectors and labels in `given`."""
    from sklearn.linear_model import LogisticRegression

    with np.load(given) as data:
        vectors, y = data["vectors"], data["y"]
    model = LogisticRegression(C=FIT_C, max_iter=3000, class_weight="balanced")
    model.fit(vectors, y)
    CategoryModel(np.asarray(model.coef_), np.asarray(model.intercept_)).save(fitted)


if __name__ == "__main__":
    fit(Path(sys.argv[1]), Path(sys.argv[2]))
