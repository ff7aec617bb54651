"""The OpenAI answer's chunks: each token's text written exactly as OpenAI's JSON would be."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from chatbox.engine.types import DoneEvent, EngineEvent, TokenEvent, Usage
from chatbox.web.openai.answer import chunks
from chatbox.web.openai.request import AnswerShape

TEXTS = [" plain", ' "quoted"', "line\nbreak", "tab\tand\\slash", " café ☕", "</script>", ""]


class Replay:
    """A finished generation's events, replayed."""

    def __init__(self, events: list[EngineEvent]) -> None:
        self.events = events
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        for event in self.events:
            yield event

    def cancel(self) -> None:
        self.cancelled = True


async def test_token_chunks_are_the_json_of_the_whole_chunk() -> None:
    events: list[EngineEvent] = [TokenEvent(t, i % 2) for i, t in enumerate(TEXTS)]
    events.append(DoneEvent("stop", Usage(3, len(TEXTS)), finish_reasons=("stop", "stop")))
    shape = AnswerShape(n=2)
    generation = Replay(events)
    out = [c async for c in chunks(generation, "chatcmpl-x", 7, "tiny", False, shape, "fp_1")]
    # two role chunks, one per token, two finishing chunks, [DONE]
    assert len(out) == 2 + len(TEXTS) + 2 + 1
    for i, text in enumerate(TEXTS):
        expected = {
            "id": "chatcmpl-x",
            "object": "chat.completion.chunk",
            "created": 7,
            "model": "tiny",
            "system_fingerprint": "fp_1",
            "choices": [{"index": i % 2, "delta": {"content": text}, "finish_reason": None}],
        }
        chunk = out[2 + i]
        assert chunk == f"data: {json.dumps(expected, ensure_ascii=False)}\n\n".encode()
        assert json.loads(chunk.decode()[len("data: ") :]) == expected
    assert out[-1] == b"data: [DONE]\n\n"
    assert generation.cancelled  # the stream always lets go of its generation
