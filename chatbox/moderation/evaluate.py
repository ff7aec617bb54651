"""Precision and recall per category on the held-out set, and how many everyday requests are
flagged or blocked (the tests and the benchmark)."""

from __future__ import annotations

from chatbox.moderation.checker import Moderator
from chatbox.moderation.classifier import BENIGN, HELDOUT, read_benign, read_labelled
from chatbox.moderation.policy import CATEGORIES


async def evaluate(
    moderator: Moderator, tier: str = "free", approximate: bool = False
) -> dict[str, dict[str, float]]:
    """Per category: precision, recall and support at the tier's thresholds; `approximate`:
    scored as answer windows are (the int8 graph where there is one, screened half-way where
    it can be cut)."""
    await moderator.start()
    rows = read_labelled(HELDOUT)
    thresholds = moderator.policy.tier(tier).thresholds
    if moderator.categories is None or moderator.embedder is None:
        raise RuntimeError("the category classifier is not available (no embedding model)")
    texts = [t for _, t in rows]
    labels = [label for label, _ in rows]
    if approximate and moderator.screening:
        scores = await moderator.screened_scores(texts)
    else:
        vectors = await moderator.embedder.embed(texts, approximate=approximate)  # one call
        scores = [moderator.categories.scores(v[None, :]) for v in vectors]
    scored = list(zip(labels, scores, strict=True))
    table: dict[str, dict[str, float]] = {}
    for c in CATEGORIES:
        predicted = [s.get(c, 0.0) >= thresholds[c] for _, s in scored]
        gold = [label == c for label, _ in scored]
        tp = sum(p and g for p, g in zip(predicted, gold, strict=True))
        table[c] = {
            "precision": tp / max(1, sum(predicted)),
            "recall": tp / max(1, sum(gold)),
            "support": float(sum(gold)),
        }
    return table


async def benign(moderator: Moderator, tier: str = "free") -> dict[str, object]:
    """The everyday requests of benign.tsv checked as messages are (`Moderator.check`, input,
    under the tier's policy): how many, and which, were flagged (any category at or over its
    threshold) or blocked."""
    await moderator.start()
    rows = read_benign(BENIGN)
    flagged: list[tuple[str, str, float]] = []  # (text, category, score)
    blocked = 0
    for _, text in rows:
        verdict = await moderator.check(text, tier, "input")
        if verdict.flagged:
            category = verdict.category or ""
            flagged.append((text, category, verdict.scores.get(category, 1.0)))
            blocked += verdict.blocked
    n = len(rows)
    return {
        "n": n,
        "flagged": len(flagged),
        "blocked": blocked,
        "flagged_rate": len(flagged) / n,
        "blocked_rate": blocked / n,
        "flagged_texts": flagged,
    }
