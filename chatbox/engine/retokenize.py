"""Tokenizing a conversation's prompt again each turn from where it last changed.

A follow-up turn's prompt is the previous one plus an answer and a message, and it is
tokenized whole every turn: ~3.6 ms for an 1,865-token SmolLM2 conversation on 2 cores
(rendering the template takes 0.2 ms), on the path to its first token. llama.cpp
splits a text at special tokens (`<|im_start|>`, ...) before it tokenizes, and tokenizes
each piece on its own, so a prompt that shares its opening with one tokenized before
keeps that prompt's tokens up to a special token in the shared part and tokenizes only
the text from that token on.

Exact by construction for BPE and SentencePiece vocabularies (the others are tokenized
whole), with a margin of the longest special token's length before the first difference
(no special token can then straddle it); the first few results are also checked
against a whole tokenization, and one that differs turns this off for the model.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from chatbox.engine.kv.prefixes import common_prefix

log = logging.getLogger(__name__)

MIN_CHARS = 2048  # shorter prompts tokenize in well under a millisecond: whole
KEEP = 16  # recent prompts remembered (per add_special), newest last
CHECKS = 4  # incremental results compared with a whole tokenization first

Tokenize = Callable[[str, bool], list[int]]  # (text, add_special) -> tokens, parse_special on


class Retokenizer:
    """tokenize(text, add_special) for one model, reusing the tokens of recent prompts.

    `specials` maps each special token id to its text (the tokens llama.cpp parses out of
    a text before tokenizing the rest). Thread-safe: the event loop and worker threads
    both tokenize prompts.
    """

    def __init__(self, tokenize: Tokenize, specials: dict[int, str], enabled: bool) -> None:
        self._tokenize = tokenize
        self._specials = {t: s for t, s in specials.items() if s}
        self._margin = max((len(s) for s in self._specials.values()), default=0)
        self.enabled = enabled and bool(self._specials)
        self._recent: dict[bool, OrderedDict[str, tuple[int, ...]]] = {
            True: OrderedDict(),
            False: OrderedDict(),
        }
        self._checks = CHECKS
        self._lock = threading.Lock()
        self.reused = 0  # tokens a cut kept from a previous prompt (checked ones too)

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        if not self.enabled or len(text) < MIN_CHARS:
            return self._tokenize(text, add_special)
        with self._lock:
            recent = self._recent[add_special]
            hit = recent.get(text)
            if hit is not None:
                recent.move_to_end(text)
                return list(hit)
            base = max(recent.items(), key=lambda kv: common_prefix(kv[0], text), default=None)
        tokens: list[int] | None = None
        if base is not None:
            cut = self._cut(base[0], base[1], common_prefix(base[0], text))
            if cut is not None:
                k, at = cut
                tokens = list(base[1][:k]) + self._tokenize(text[at:], False)
                self.reused += k
                if self._checks > 0:
                    tokens = self._check(text, add_special, tokens)
        if tokens is None:
            tokens = self._tokenize(text, add_special)
        with self._lock:
            recent[text] = tuple(tokens)
            if len(recent) > KEEP:
                recent.popitem(last=False)
        return tokens

    def _cut(self, old: str, tokens: tuple[int, ...], same: int) -> tuple[int, int] | None:
        """(k, at): the latest special token tokens[k] of `old`, found at old[at:], that
        ends at least a margin before the first character that differs; None: none."""
        limit = len(old)
        for k in range(len(tokens) - 1, 0, -1):
            piece = self._specials.get(tokens[k])
            if piece is None:
                continue
            at = old.rfind(piece, 0, limit)
            if at < 0:
                return None  # the text does not hold the token's text: not ours to cut
            if at + len(piece) + self._margin <= same:
                return k, at
            limit = at
        return None

    def _check(self, text: str, add_special: bool, tokens: list[int]) -> list[int]:
        whole = self._tokenize(text, add_special)
        with self._lock:
            self._checks -= 1
            if tokens != whole:
                self.enabled = False
                log.warning("incremental tokenization differs for this model: turned off")
        return whole
