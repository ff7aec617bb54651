"""UTF-8-safe incremental detokenizing with stop-string holdback.

Tokens arrive as byte pieces. Incomplete UTF-8 sequences are held until complete (invalid
bytes become U+FFFD; the start of a character an answer ends inside of, cut by max_tokens, is
dropped), and any text tail that could be the start of a stop string is held until it either
completes the stop (generation ends, the stop is not emitted) or diverges.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class StopTextStream:
    """Feed byte pieces; get back text safe to emit now."""

    def __init__(self, stops: Sequence[str] = (), lstrip: bool = False) -> None:
        self._lstrip = lstrip  # drop whitespace before the first visible character
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stops if s)
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self._pending = ""  # decoded text not yet emitted (a possible stop prefix)
        self.stopped = False  # a stop string was found
        self._started = False  # visible text was emitted (no copy of it is kept: `+=` on
        # an attribute copies the whole string, every token of a long answer)

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that may be emitted now."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(piece)
        return self._release(final=False)

    def finish(self) -> str:
        """End of generation: flush what is held. The bytes of a character the answer ended
        inside of (a max_tokens cut) are dropped: they are half a character, not an error."""
        if self.stopped:
            return ""
        self._decoder.reset()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        text = self._pending
        if not self._stops:
            self._pending = ""
            return self._emit(text)
        cut = -1
        for stop in self._stops:
            i = text.find(stop)
            if i >= 0 and (cut < 0 or i < cut):
                cut = i
        if cut >= 0:
            self.stopped = True
            self._pending = ""
            return self._emit(text[:cut])
        if final:
            self._pending = ""
            return self._emit(text)
        hold = self._holdback(text)
        self._pending = text[len(text) - hold :] if hold else ""
        return self._emit(text[: len(text) - hold])

    def _holdback(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of some stop."""
        for n in range(min(len(text), self._max_stop - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0

    def _emit(self, text: str) -> str:
        if self._lstrip and not self._started:
            text = text.lstrip()
        self._started = self._started or bool(text)
        return text
