"""The replica protocol's data: requests and events as JSON, and replica specs.

A chatbox replica takes `POST /v1/replica/generate` with a request as JSON and answers with
NDJSON lines: `{"type": "start", "prompt_tokens": n}`, then `{"type": "token", "id": i,
"text": ...}` per event (several may share one chunk), `{"type": "wait"}` heartbeats while
nothing else is sent, and one `{"type": "done", ...}` last. Closing the connection cancels.
`POST /v1/replica/forget` with `{"cache_keys": [...], "scopes": [...], "model": name or null}`
drops erased conversations' KV, and every KV of erased accounts' cache scopes (cached, parked in
RAM or on disk), from that model, or from every model.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, fields, is_dataclass
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    EngineStats,
    GenerationRequest,
    TokenEvent,
    ToolSpec,
)

PREFIX = "/v1/replica"
KINDS = ("chatbox", "openai")


class ProtocolError(Exception):
    """A replica sent something this protocol does not allow (it is treated as failed)."""


def encode(value: Any) -> Any:
    """A dataclass tree as JSON data (bytes as {"$b": base64})."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(value).decode()}
    return value


def decode(kind: Any, data: Any) -> Any:
    """JSON data back into `kind` (a dataclass, tuple, union, literal or scalar type),
    checking each value's type on the way: ValueError names what does not fit."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is Any:
        return data
    if isinstance(kind, type) and is_dataclass(kind):
        if not isinstance(data, dict):
            raise ValueError(f"{kind.__name__} must be an object")
        hints = get_type_hints(kind)
        names = {f.name for f in fields(kind) if f.init}
        return kind(**{k: decode(hints[k], v) for k, v in data.items() if k in names})
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError("expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v) for v in data)
        if len(args) != len(data):
            raise ValueError(f"expected {len(args)} items")
        return tuple(decode(a, v) for a, v in zip(args, data, strict=True))
    if origin in (Union, UnionType):
        if data is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return decode(option, data)
            except ValueError:
                continue
        raise ValueError(f"{data!r} fits none of {kind}")
    if origin is Literal:
        if data not in args:
            raise ValueError(f"{data!r} is not one of {', '.join(map(str, args))}")
        return data
    if kind is bytes:
        if not isinstance(data, dict) or not isinstance(data.get("$b"), str):
            raise ValueError("expected bytes")
        return base64.b64decode(data["$b"])
    if kind is float and isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    if kind in (int, str, bool) and type(data) is kind:
        return data
    raise ValueError(f"expected {getattr(kind, '__name__', kind)}, got {type(data).__name__}")


def request_to_json(model: str, request: GenerationRequest) -> dict[str, Any]:
    body: dict[str, Any] = encode(request)
    body["model"] = model
    return body


def request_from_json(body: Any) -> tuple[str, GenerationRequest]:
    """The model and request a replica was sent; ValueError says what is wrong."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise ValueError("a request needs a model")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ValueError("a request needs messages")
    try:
        request = decode(GenerationRequest, {k: v for k, v in body.items() if k != "model"})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad request: {exc}") from exc
    return body["model"], request


MAX_FORGET_KEYS = 100_000  # an account's conversations, in one call


def forget_to_json(
    model: str | None, cache_keys: list[str], scopes: list[str] | None = None
) -> dict[str, Any]:
    return {"model": model, "cache_keys": cache_keys, "scopes": scopes or []}


def _strings(body: dict[str, Any], field: str) -> list[str]:
    values = body.get(field, [])
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{field} must be a list of non-empty strings")
    if len(values) > MAX_FORGET_KEYS:
        raise ValueError(f"at most {MAX_FORGET_KEYS} {field} a call")
    return values


def forget_from_json(body: Any) -> tuple[str | None, list[str], list[str]]:
    """The model (None: every model), cache keys and cache scopes (erased accounts: every KV
    of theirs, stateless completions' too) of a forget call; ValueError if bad."""
    if not isinstance(body, dict):
        raise ValueError("a forget call is a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError("model must be a string or null")
    if "cache_keys" not in body:
        raise ValueError("cache_keys must be a list of non-empty strings")
    return model, _strings(body, "cache_keys"), _strings(body, "scopes")


def estimate_tokens(messages: tuple[ChatMessage, ...], tools: tuple[ToolSpec, ...] = ()) -> int:
    """A cautious prompt size without a tokenizer: ~3 bytes a token plus template overhead."""
    described = sum(len(json.dumps(encode(t)).encode()) // 3 + 8 for t in tools)
    return sum(len(m.content.encode()) // 3 + 8 for m in messages) + described + 8


def line(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, separators=(",", ":")) + "\n").encode()


def event_to_json(event: TokenEvent | DoneEvent, event_id: int = 0) -> dict[str, Any]:
    if isinstance(event, TokenEvent):
        return {"type": "token", "id": event_id, **encode(event)}
    return {"type": "done", **encode(event)}


def event_from_json(payload: dict[str, Any]) -> TokenEvent | DoneEvent:
    kind = TokenEvent if payload.get("type") == "token" else DoneEvent
    try:
        event: TokenEvent | DoneEvent = decode(
            kind, {k: v for k, v in payload.items() if k not in ("type", "id")}
        )
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"bad {payload.get('type')} event: {exc}") from exc
    return event


def stats_from_json(payload: Any) -> EngineStats:
    if not isinstance(payload, dict):
        return EngineStats()
    known = {f.name for f in fields(EngineStats)}
    return EngineStats(**{k: int(v) for k, v in payload.items() if k in known})


@dataclass(frozen=True)
class ReplicaSpec:
    """How to reach one replica: `[openai+]http://host:port[#slots=N&models=a+b=remote]`.

    An OpenAI server's models map the front's names to the server's (`name=remote-id`); a
    bare name is used as is. Slots are how many answers it runs at once (0: ask it).
    """

    url: str
    kind: str = "chatbox"
    slots: int = 0
    models: tuple[str, ...] = ()
    secret: str | None = None

    @classmethod
    def parse(cls, text: str, secret: str | None = None) -> ReplicaSpec:
        text = text.strip()
        kind = "chatbox"
        if "+" in text.split("://", 1)[0]:
            kind, text = text.split("+", 1)
        if kind not in KINDS:
            raise ValueError(f"unknown replica kind {kind!r} (chatbox or openai)")
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a replica URL must be http(s)://host:port, not {text!r}")
        options = dict(parse_qsl(parts.fragment))
        unknown = set(options) - {"slots", "models"}
        if unknown:
            raise ValueError(f"unknown replica option(s): {', '.join(sorted(unknown))}")
        try:
            slots = int(options.get("slots", "0"))
        except ValueError as exc:
            raise ValueError("slots must be a whole number") from exc
        # "models=a+b" (a "+" reads as a space here) keeps CHATBOX_REPLICAS comma-separated
        models = tuple(options.get("models", "").replace(",", " ").split())
        url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        return cls(url, kind, max(0, slots), models, secret)

    def model_map(self) -> dict[str, str]:
        """The front's model names -> the names the replica knows them by."""
        out: dict[str, str] = {}
        for item in self.models:
            name, _, remote = item.partition("=")
            out[name] = remote or name
        return out
