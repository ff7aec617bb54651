"""The layers that score text: profanity (a scikit-learn model shipped in the
alt-profanity-check wheel) and the seven categories (logistic regression on MiniLM
embeddings, trained at first start on the labelled set in data/train.tsv and cached)."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chatbox.moderation.policy import CATEGORIES

DATA_DIR = Path(__file__).resolve().parent / "data"
TRAIN = DATA_DIR / "train.tsv"
HELDOUT = DATA_DIR / "heldout.tsv"
LABELS = ("none", *CATEGORIES)
SEGMENT_CHARS = 800  # MiniLM reads 256 word pieces: longer text is scored in pieces
MAX_SEGMENTS = 64
# An answer window is finished past the cut (embedder.SCREEN_LAYERS) when the screen, a
# classifier on vectors at the cut, gives any category this much: low enough that no text
# of the held-out set or of SmolLM2's answers that the whole graph scores >= 0.6 in any
# category is stopped at the cut.
SCREEN_THRESHOLD = 0.15
SCREEN_FLOOR = 0.5  # a policy with a category threshold below this is not screened
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


def segments(text: str) -> list[str]:
    """The pieces a long text is scored in (evenly spread past MAX_SEGMENTS)."""
    if len(text) <= SEGMENT_CHARS:
        return [text]
    starts = list(range(0, len(text), SEGMENT_CHARS))
    if len(starts) > MAX_SEGMENTS:
        step = len(starts) / MAX_SEGMENTS
        starts = [starts[int(i * step)] for i in range(MAX_SEGMENTS)]
    return [text[s : s + SEGMENT_CHARS] for s in starts]


class Profanity:
    """P(profane) per text; None when alt-profanity-check is not installed.

    The package's model is a TF-IDF vectoriser and a calibrated linear SVM (five folds, each
    a LinearSVC and a sigmoid). scikit-learn's predict_proba spends milliseconds per message
    on validation around five tiny products, so the folds are read once into arrays and scored
    here with the same arithmetic (checked against the package at load; otherwise its own
    predict_prob is used)."""

    def __init__(self) -> None:
        self._model: Any = None
        self._folds: _SigmoidFolds | None = None
        self._lock = threading.Lock()
        self.available = True

    def _load(self) -> Any:
        with self._lock:
            if self._model is None and self.available:
                try:
                    import profanity_check  # a 1 MB scikit-learn model, loaded once

                    self._folds = _SigmoidFolds.read(profanity_check)
                    self._model = profanity_check
                except ImportError:
                    log.warning("alt-profanity-check is not installed: no profanity scores")
                    self.available = False
            return self._model

    def scores(self, texts: Sequence[str]) -> list[float] | None:
        model = self._load()
        if model is None or not texts:
            return None
        if self._folds is not None:
            return self._folds.scores(list(texts))
        return [float(p) for p in model.predict_prob(list(texts))]


class _SigmoidFolds:
    """alt-profanity-check's calibrated SVM as arrays: P = mean over folds of
    expit(-(a * (x . w + c) + b)), which is what CalibratedClassifierCV computes."""

    def __init__(self, vectorizer: Any, weights: Any, bias: Any, a: Any, b: Any) -> None:
        self.vectorizer = vectorizer
        self.weights = weights  # (features, folds)
        self.bias, self.a, self.b = bias, a, b  # (folds,) each

    @classmethod
    def read(cls, package: Any) -> _SigmoidFolds | None:
        """The folds of the package's model, or None if it is not that shape."""
        try:
            inner = package.profanity_check
            folds = inner.model.calibrated_classifiers_
            if any(f.method != "sigmoid" or len(f.calibrators) != 1 for f in folds):
                return None
            weights = np.stack([np.ravel(f.estimator.coef_) for f in folds], axis=1)
            bias = np.array([float(np.ravel(f.estimator.intercept_)[0]) for f in folds])
            a = np.array([float(f.calibrators[0].a_) for f in folds])
            b = np.array([float(f.calibrators[0].b_) for f in folds])
            fast = cls(inner.vectorizer, weights, bias, a, b)
            probe = ["you are a lovely person", "what the hell is this crap", "hello"]
            expected = np.asarray(package.predict_prob(probe), dtype=np.float64)
            if np.allclose(fast.scores(probe), expected, atol=1e-9):
                return fast
        except (AttributeError, IndexError, TypeError, ValueError):
            pass
        log.info("alt-profanity-check's model has another shape: scored by the package")
        return None

    def scores(self, texts: list[str]) -> list[float]:
        decision = self.vectorizer.transform(texts) @ self.weights + self.bias
        proba = 1.0 / (1.0 + np.exp(self.a * decision + self.b))
        return [float(p) for p in np.asarray(proba).mean(axis=1)]


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
        from sklearn.linear_model import LogisticRegression

        y = np.array([LABELS.index(label) for label in labels])
        model = LogisticRegression(C=32.0, max_iter=3000, class_weight="balanced")
        model.fit(vectors, y)
        return cls(np.asarray(model.coef_), np.asarray(model.intercept_))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
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
    key = TRAIN.read_bytes() + str(embedding_model).encode()
    if vectors:
        key += f"|{vectors}".encode()
    digest = hashlib.sha256(key).hexdigest()
    return cache_dir / "moderation" / f"{kind}-{digest[:16]}.npz"
