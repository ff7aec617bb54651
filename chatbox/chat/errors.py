"""What can go wrong when taking a turn; the web layer maps each kind to a status code."""

from __future__ import annotations


class ChatError(Exception):
    """Base of the chat layer's errors; the message is safe to show a user."""


class InvalidInput(ChatError):
    """The request is malformed or empty (422; 400 on the OpenAI-compatible API).

    `param` names the offending request field where there is one.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class GenerationFailed(ChatError):
    """The model failed while answering: a server-side error (500), never the client's."""


class NotFound(ChatError):
    """No such conversation or turn for this user (404)."""


class Forbidden(ChatError):
    """The user may see this but not do that (403): sharing off for the tier, a member
    managing a workspace only its owners manage."""


class UnknownModel(ChatError):
    """The model asked for is not available (404); lists those that are."""

    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(f"unknown model {name!r}; available models: {', '.join(available)}")
        self.name = name
        self.available = available


class TooLong(ChatError):
    """The message cannot fit in the model's context window, or is longer than the message
    limit in characters (413); the message counts in the unit the limit is set in."""

    def __init__(self, tokens: int, limit: int, param: str | None = None) -> None:
        what = "the prompt" if param == "prompt" else "the message"
        super().__init__(
            f"{what} is {tokens} tokens; this model's context window is {limit} tokens"
        )
        self.tokens = tokens
        self.limit = limit
        self.param = param  # the request field that is too long, where there is one
        self.unit = "tokens"

    @classmethod
    def characters(cls, chars: int, limit: int) -> TooLong:
        """A message over the character limit (`max_message_chars`)."""
        exc = cls(chars, limit)
        exc.args = (f"the message is {chars:,} characters; the limit is {limit:,} characters",)
        exc.unit = "characters"
        return exc


class Refused(ChatError):
    """Moderation refused the message (400 `content_filter`): nothing was stored or run.

    The message is the explanation for the user (for self-harm, support and resources)."""

    def __init__(self, message: str, category: str, scores: dict[str, float]) -> None:
        super().__init__(message)
        self.category = category
        self.scores = scores


class Busy(ChatError):
    """This conversation is still generating an answer (409)."""


class Overloaded(ChatError):
    """The engine cannot take more work now (503); retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(ChatError):
    """Over a per-user limit (429): a token bucket, a budget, or concurrent answers.

    `headers` carries Retry-After and the x-ratelimit-* headers for requests and tokens.
    """

    def __init__(
        self,
        message: str,
        retry_after: int,
        headers: dict[str, str] | None = None,
        kind: str = "requests",
    ) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)
        self.kind = kind  # requests | tokens | budget | streams
        self.headers = {**(headers or {}), "Retry-After": str(self.retry_after)}
