"""The profanity layer: alt-profanity-check's model, scored with numpy.

The package's model is a TF-IDF vectoriser and a calibrated linear SVM (five folds, each a
LinearSVC and a sigmoid), pickled with scikit-learn. Unpickling it imports scikit-learn and
SciPy, about 90 MB of a serving process's memory for a 15,000-word vocabulary and five
weight vectors. So a child process reads the model once into plain arrays (checked there
against the package's own probabilities) and caches them; the server loads the arrays and
scores with the same arithmetic, and never imports scikit-learn.

    python -m chatbox.moderation.profanity OUT.npz    # what the child runs
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PACKAGE = "alt-profanity-check"
# scikit-learn's default token_pattern, on lowercased text (the package's vectoriser)
TOKEN = re.compile(r"(?u)\b\w\w+\b")
PROBES = ("you are a lovely person", "what the hell is this crap", "hello", "", "damn it")
EXPORT_TIMEOUT_S = 300
log = logging.getLogger("chatbox.moderation")


class TfidfFolds:
    """P(profane) = mean over folds of expit(-(a * (x . w + c) + b)), x the text's TF-IDF
    vector (raw counts times idf, L2-normalised): what CalibratedClassifierCV computes."""

    def __init__(
        self,
        words: Sequence[str],
        idf: np.ndarray,
        weights: np.ndarray,
        bias: np.ndarray,
        a: np.ndarray,
        b: np.ndarray,
    ) -> None:
        self.index = {w: i for i, w in enumerate(words)}
        self.words = list(words)
        self.idf = np.asarray(idf, dtype=np.float64)
        self.weights = np.asarray(weights, dtype=np.float64)  # (features, folds)
        self.bias = np.asarray(bias, dtype=np.float64)  # (folds,) each
        self.a, self.b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)

    def scores(self, texts: Sequence[str]) -> list[float]:
        out = []
        for text in texts:
            counts: dict[int, int] = {}
            for token in TOKEN.findall(text.lower()):
                i = self.index.get(token)
                if i is not None:
                    counts[i] = counts.get(i, 0) + 1
            decision = self.bias.copy()
            if counts:
                idx = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
                x = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
                x *= self.idf[idx]
                x /= np.sqrt(np.dot(x, x))
                decision += x @ self.weights[idx]
            proba = 1.0 / (1.0 + np.exp(self.a * decision + self.b))
            out.append(float(proba.mean()))
        return out

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")  # servers starting together
        np.savez(
            tmp,
            words=np.array(self.words, dtype=str),
            idf=self.idf,
            weights=self.weights,
            bias=self.bias,
            a=self.a,
            b=self.b,
        )
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> TfidfFolds:
        with np.load(path, allow_pickle=False) as d:
            return cls(d["words"].tolist(), d["idf"], d["weights"], d["bias"], d["a"], d["b"])

    @classmethod
    def read(cls, package: Any) -> TfidfFolds | None:
        """The arrays of the package's model, or None where it is not that shape or they
        do not give the package's probabilities (needs scikit-learn: the child's work)."""
        inner = package.profanity_check
        vectorizer, folds = inner.vectorizer, inner.model.calibrated_classifiers_
        p = vectorizer.get_params()
        plain = (p["analyzer"], p["lowercase"], p["ngram_range"], p["norm"]) == (
            "word",
            True,
            (1, 1),
            "l2",
        )
        same = p["token_pattern"] == TOKEN.pattern and not p["sublinear_tf"] and p["use_idf"]
        if not (plain and same and p["tokenizer"] is None and p["preprocessor"] is None):
            return None
        if any(f.method != "sigmoid" or len(f.calibrators) != 1 for f in folds):
            return None
        words = [""] * len(vectorizer.vocabulary_)
        for word, i in vectorizer.vocabulary_.items():
            words[i] = word
        weights = np.stack([np.ravel(f.estimator.coef_) for f in folds], axis=1)
        bias = np.array([float(np.ravel(f.estimator.intercept_)[0]) for f in folds])
        a = np.array([float(f.calibrators[0].a_) for f in folds])
        b = np.array([float(f.calibrators[0].b_) for f in folds])
        fast = cls(words, vectorizer.idf_, weights, bias, a, b)
        expected = np.asarray(package.predict_prob(list(PROBES)), dtype=np.float64)
        return fast if np.allclose(fast.scores(PROBES), expected, atol=1e-9) else None


def arrays_file(cache_dir: Path) -> Path | None:
    """Where the installed package's arrays are cached (None: the package is missing)."""
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    key = hashlib.sha256(f"{version}|{TOKEN.pattern}".encode()).hexdigest()[:16]
    return cache_dir / "moderation" / f"profanity-{key}.npz"


def export(path: Path) -> bool:
    """Read the package's model into arrays at path, in this process (the child's)."""
    import profanity_check  # scikit-learn comes with it

    folds = TfidfFolds.read(profanity_check)
    if folds is None:
        return False
    folds.save(path)
    return True


class Profanity:
    """P(profane) per text; None when alt-profanity-check is not installed. Scored from
    the cached arrays, made by a child process the first time; where they cannot be made
    (another shape of model), the package itself scores in this process."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.cache_dir = cache_dir
        self._folds: TfidfFolds | None = None
        self._package: Any = None
        self._lock = threading.Lock()
        self.available = True

    def _load(self) -> TfidfFolds | Any:
        with self._lock:
            if self._folds is None and self._package is None and self.available:
                path = arrays_file(self.cache_dir) if self.cache_dir is not None else None
                if path is None and self.cache_dir is not None:
                    log.warning("alt-profanity-check is not installed: no profanity scores")
                    self.available = False
                    return None
                if path is not None and not path.exists():
                    self._export(path)
                if path is not None and path.exists():
                    try:
                        self._folds = TfidfFolds.load(path)
                    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
                        log.warning("profanity arrays unreadable (%s): the package scores", exc)
                        path.unlink(missing_ok=True)
                if self._folds is None:
                    self._package = self._import()
            return self._folds or self._package

    @staticmethod
    def _export(path: Path) -> None:
        cmd = [sys.executable, "-m", "chatbox.moderation.profanity", str(path)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("profanity model not read into arrays (%s): the package scores it", exc)
            return
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["another shape of model"])[-1]
            log.warning("profanity model not read into arrays (%s): the package scores it", why)

    def _import(self) -> Any:
        try:
            import profanity_check  # scikit-learn and all: only where arrays cannot be had

            return profanity_check
        except ImportError:
            log.warning("alt-profanity-check is not installed: no profanity scores")
            self.available = False
            return None

    @property
    def arrays(self) -> bool:
        """Whether texts are scored from the arrays (not by the package in this process)."""
        self._load()
        return self._folds is not None

    def scores(self, texts: Sequence[str]) -> list[float] | None:
        model = self._load()
        if model is None or not texts:
            return None
        if isinstance(model, TfidfFolds):
            return model.scores(list(texts))
        return [float(p) for p in model.predict_prob(list(texts))]


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m chatbox.moderation.profanity OUT.npz", file=sys.stderr)
        return 2
    if not export(Path(argv[0])):
        print("the package's model has another shape", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
