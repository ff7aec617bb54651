"""ChatGPT's data-export shape (`conversations.json`): writing it, and reading it back
strictly. A file that is not that shape, or is larger, deeper or longer than the limits,
is refused as a whole with a message that says where and why; what a valid file holds that
chatbox cannot keep (images, recordings, tool messages, impossible times) is left out and
counted in an `ImportReport`."""

from __future__ import annotations

import io
import json
import math
import re
import time
import zipfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from chatbox.chat.errors import InvalidInput
from chatbox.store import Conversation, Turn
from chatbox.store.transfer import ConversationIn, TurnIn

ROLES = ("user", "assistant")
_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
EXAMPLES = 3  # examples kept per kind of thing left out
FUTURE_SLACK_S = 86_400.0  # a time up to a day ahead of this clock is a skewed clock, kept
# Parts that are a file in ChatGPT's export (not in conversations.json): what each is, in words.
ASSETS = {
    "image_asset_pointer": "image",
    "audio_asset_pointer": "voice recording",
    "real_time_user_audio_video_asset_pointer": "voice or video recording",
    "video_container_asset_pointer": "video",
}


class ImportRefused(InvalidInput):
    """The file cannot be imported (422); nothing of it was."""

    def __init__(self, message: str) -> None:
        super().__init__(f"import refused: {message}", "file")


@dataclass(frozen=True)
class Limits:
    max_bytes: int  # the file (or the zip's conversations.json, unpacked)
    max_message_chars: int
    max_title_chars: int
    max_system_prompt_chars: int
    max_conversations: int = 10_000
    max_messages: int = 200_000  # in all conversations together


@dataclass
class Dropped:
    """One kind of thing an import left out: how many, why, and where a few of them were."""

    kind: str
    reason: str
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "count": self.count,
            "examples": self.examples,
        }


@dataclass
class ImportReport:
    """What an import took in and what it left out (by kind, with a few examples)."""

    conversations: int = 0
    messages: int = 0
    documents: int = 0
    memories: int = 0
    dropped: dict[str, Dropped] = field(default_factory=dict)

    def drop(self, kind: str, reason: str, where: str) -> None:
        entry = self.dropped.setdefault(kind, Dropped(kind, reason))
        entry.count += 1
        if len(entry.examples) < EXAMPLES:
            entry.examples.append(where)

    def as_dict(self) -> dict[str, Any]:
        return {
            "conversations": self.conversations,
            "messages": self.messages,
            "documents": self.documents,
            "memories": self.memories,
            "dropped": [d.as_dict() for d in self.dropped.values()],
        }


@dataclass
class Parsed:
    """A checked export: its conversations (with the id each had in the file), and what
    reading it left out."""

    conversations: list[ConversationIn]
    source_ids: list[str | None]
    report: ImportReport


# -- writing --------------------------------------------------------------------------------


def _node(
    node_id: str, role: str | None, text: str, at: float, parent: str | None, model: str | None
) -> dict[str, Any]:
    message = None
    if role is not None:
        message = {
            "id": node_id,
            "author": {"role": role},
            "content": {"content_type": "text", "parts": [text]},
            "create_time": at,
            "metadata": {"model_slug": model} if model else {},
        }
    return {"id": node_id, "message": message, "parent": parent, "children": []}


def to_chatgpt(conv: Conversation, turns: list[Turn]) -> dict[str, Any]:
    """One conversation with every branch, as ChatGPT's export writes it."""
    root = f"{conv.id}-root"
    mapping = {root: _node(root, None, "", conv.created_at, None, None)}
    top = root
    if conv.system_prompt:
        top = f"{conv.id}-system"
        mapping[top] = _node(top, "system", conv.system_prompt, conv.created_at, root, None)
        mapping[root]["children"].append(top)
    for t in turns:
        parent = t.parent_id or top
        mapping[t.id] = _node(t.id, t.role, t.content, t.created_at, parent, t.model)
        mapping[parent]["children"].append(t.id)
    return {
        "id": conv.id,
        "conversation_id": conv.id,
        "title": conv.title or "",
        "create_time": conv.created_at,
        "update_time": conv.updated_at,
        "current_node": conv.active_leaf_id or top,
        "mapping": mapping,
    }


# -- reading --------------------------------------------------------------------------------


def unpack(data: bytes, max_bytes: int) -> bytes:
    """The conversations.json itself: the bytes given, or the file of that name in a zip
    (read no further than max_bytes, so a zip bomb stops there)."""
    if not data.startswith(b"PK"):
        if len(data) > max_bytes:
            raise ImportRefused(f"the file is over {max_bytes:,} bytes")
        return data
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = [n for n in zf.namelist() if n.rsplit("/", 1)[-1] == "conversations.json"]
            if not names:
                raise ImportRefused("the zip holds no conversations.json")
            name = min(names, key=len)
            with zf.open(name) as member:
                body = member.read(max_bytes + 1)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, RuntimeError, EOFError) as exc:
        raise ImportRefused(f"not a readable zip file ({exc})") from exc
    if len(body) > max_bytes:
        raise ImportRefused(f"conversations.json unpacks to over {max_bytes:,} bytes")
    return body


def _skip(text: str, at: int) -> int:
    """Where the JSON whitespace from `at` ends."""
    space = _SPACE.match(text, at)
    return space.end() if space else at


def _items(body: bytes) -> Iterator[Any]:
    """The conversations of the file, one at a time: a top-level list is decoded item by
    item, so that the thread reading it lets the server's event loop run between items and
    each item's objects can go once it is read (json.loads of 50 MB holds the interpreter
    for over a second, then its garbage collection for as long again)."""
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    at = _skip(text, 0)
    if not text.startswith("[", at):
        raw = json.loads(text)
        if isinstance(raw, dict) and isinstance(raw.get("conversations"), list):
            yield from raw["conversations"]
            return
        raise ImportRefused("expected a list of conversations (ChatGPT's conversations.json)")
    decoder = json.JSONDecoder()
    at = _skip(text, at + 1)
    if text.startswith("]", at):
        at += 1
    else:
        while True:
            item, at = decoder.raw_decode(text, at)
            yield item
            at = _skip(text, at)
            if text.startswith(",", at):
                at = _skip(text, at + 1)
                continue
            if text.startswith("]", at):
                at += 1
                break
            raise ValueError(f"expected ',' or ']' at character {at}")
    if _skip(text, at) != len(text):
        raise ValueError(f"extra data at character {at}")


def parse(data: bytes, limits: Limits, now: float | None = None) -> Parsed:
    """Every conversation of a ChatGPT export, checked whole before anything is stored
    (`now`: the import's time, which stands in for a time that cannot be right)."""
    body = unpack(data, limits.max_bytes)
    at = time.time() if now is None else now
    out: list[ConversationIn] = []
    sources: list[str | None] = []
    total = 0
    report = ImportReport()
    try:
        for i, item in enumerate(_items(body)):
            if i >= limits.max_conversations:
                raise ImportRefused(
                    f"over {limits.max_conversations:,} conversations; that is the limit"
                )
            conv = _conversation(item, limits, f"conversation {i + 1}", report, at)
            total += len(conv.turns)
            if total > limits.max_messages:
                raise ImportRefused(f"over {limits.max_messages:,} messages in all")
            out.append(conv)
            source = item.get("conversation_id", item.get("id"))
            sources.append(source if isinstance(source, str) else None)
    except RecursionError as exc:
        raise ImportRefused("the JSON is nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImportRefused(f"not valid JSON ({str(exc)[:120]})") from exc
    return Parsed(out, sources, report)


@dataclass(frozen=True)
class _Clock:
    """Checks a time read from the file: a number, and a date this clock can stand behind."""

    report: ImportReport
    now: float

    def __call__(self, value: Any, where: str, name: str, default: float) -> float:
        if value is None:
            return default
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ImportRefused(f"{where}: {name} must be a number of seconds")
        if not 0 <= value <= self.now + FUTURE_SLACK_S:
            self.report.drop(
                "impossible time",
                "a time before 1970 or in the future; the nearest sound time is kept instead",
                f"{where}: {name} {value!r}",
            )
            return default
        return float(value)


def _part(part: Any, report: ImportReport, where: str) -> str | None:
    """The text of one part of a message, or None (reported) for one without text."""
    if isinstance(part, str):
        return part
    kind = part.get("content_type") if isinstance(part, dict) else None
    if kind == "audio_transcription" and isinstance(part.get("text"), str):
        return str(part["text"])  # what was said in a voice chat: its words come across
    if isinstance(kind, str) and kind in ASSETS:
        what = ASSETS[kind]
        report.drop(
            what,
            f"the {what} is a separate file of the export; chatbox imports the text only",
            where,
        )
    else:
        name = kind[:40] if isinstance(kind, str) else type(part).__name__
        report.drop(f"{name} part", "not text; chatbox imports the text only", where)
    return None


def _text(message: dict[str, Any], where: str, report: ImportReport) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, dict):
        raise ImportRefused(f"{where}: content must be an object")
    parts = content.get("parts")
    if parts is None:
        text = content.get("text", "")
        if not isinstance(text, str):
            raise ImportRefused(f"{where}: content text must be a string")
        return text
    if not isinstance(parts, list):
        raise ImportRefused(f"{where}: content parts must be a list")
    texts = (_part(p, report, where) for p in parts)
    return "\n".join(t for t in texts if t is not None)


def _dropped_message(
    report: ImportReport, message: dict[str, Any], role: str, text: str, where: str
) -> None:
    """Report a message that does not become a turn, when it held anything at all."""
    content = message.get("content")
    kind = content.get("content_type") if isinstance(content, dict) else None
    if text.strip():
        if role == "system":
            reason = "only a first system message becomes the conversation's system prompt"
            report.drop("system message", reason, where)
        else:
            reason = "chatbox keeps your messages and the assistant's answers only"
            report.drop(f"{role[:40]} message", reason, where)
    elif role in ROLES and isinstance(kind, str) and kind not in ("text", "multimodal_text"):
        report.drop(f"{kind[:40]} message", "holds no text chatbox can import", where)


def _conversation(
    item: Any, limits: Limits, where: str, report: ImportReport, now: float
) -> ConversationIn:
    if not isinstance(item, dict):
        raise ImportRefused(f"{where} is not an object")
    mapping = item.get("mapping")
    if not isinstance(mapping, dict) or not mapping:
        raise ImportRefused(f"{where} has no mapping of messages")
    title = item.get("title")
    if title is not None and not isinstance(title, str):
        raise ImportRefused(f"{where}: title must be a string")
    if title and len(title) > limits.max_title_chars:
        raise ImportRefused(f"{where}: the title is over {limits.max_title_chars:,} characters")
    if title:
        where = f"{where} ({title[:40]!r})"
    clock = _Clock(report, now)
    created = clock(item.get("create_time"), where, "create_time", now)
    updated = clock(item.get("update_time"), where, "update_time", created)
    nodes: dict[str, dict[str, Any]] = {}
    for key, node in mapping.items():
        if not isinstance(node, dict):
            raise ImportRefused(f"{where}: node {str(key)[:40]!r} is not an object")
        parent = node.get("parent")
        if parent is not None and (not isinstance(parent, str) or parent not in mapping):
            raise ImportRefused(f"{where}: node {key[:40]!r} has an unknown parent")
        message = node.get("message")
        if message is not None and not isinstance(message, dict):
            raise ImportRefused(f"{where}: node {key[:40]!r} has a message that is not an object")
        nodes[key] = node
    order = _tree_order(nodes, where)
    return _turns(item, nodes, order, limits, where, title or None, (created, updated), clock)


def _tree_order(nodes: dict[str, dict[str, Any]], where: str) -> list[str]:
    """Node ids parents first (by the parent links); a cycle is refused."""
    children: dict[str | None, list[str]] = {}
    for key, node in nodes.items():
        children.setdefault(node.get("parent"), []).append(key)
    order, queue = [], deque(children.get(None, []))
    while queue:
        key = queue.popleft()
        order.append(key)
        queue.extend(children.get(key, []))
    if len(order) != len(nodes):
        raise ImportRefused(f"{where}: the messages' parent links form a loop")
    return order


def _turns(
    item: dict[str, Any],
    nodes: dict[str, dict[str, Any]],
    order: list[str],
    limits: Limits,
    where: str,
    title: str | None,
    times: tuple[float, float],
    clock: _Clock,
) -> ConversationIn:
    created, updated = times
    kept: dict[str, int | None] = {}  # node id -> index of its nearest kept ancestor-or-self
    turns: list[TurnIn] = []
    system: str | None = None
    for key in order:
        node = nodes[key]
        parent = node.get("parent")
        above = kept.get(parent) if parent is not None else None
        kept[key] = above
        message = node.get("message")
        if message is None:
            continue
        at = f"{where}, message {key[:40]!r}"
        author = message.get("author")
        role = author.get("role") if isinstance(author, dict) else None
        if not isinstance(role, str):
            raise ImportRefused(f"{at}: author.role must be a string")
        text = _text(message, at, clock.report)
        if len(text) > limits.max_message_chars:
            raise ImportRefused(f"{at}: over {limits.max_message_chars:,} characters")
        if role == "system" and above is None and not turns and text.strip():
            if len(text) > limits.max_system_prompt_chars:
                raise ImportRefused(f"{at}: the system prompt is too long")
            system = text
            continue
        if role not in ROLES or not text.strip():
            _dropped_message(clock.report, message, role, text, at)
            continue  # tools, hidden and image-only messages: their children move up
        meta = message.get("metadata")
        model = meta.get("model_slug") if isinstance(meta, dict) else None
        turns.append(
            TurnIn(
                role,
                text,
                above,
                clock(message.get("create_time"), at, "create_time", created),
                model if isinstance(model, str) and len(model) <= 200 else None,
            )
        )
        kept[key] = len(turns) - 1
    current = item.get("current_node")
    leaf = kept.get(current) if isinstance(current, str) else None
    if leaf is None and turns:
        leaf = len(turns) - 1
    return ConversationIn(title, system, created, max(updated, created), turns, leaf)
