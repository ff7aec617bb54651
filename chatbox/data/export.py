"""A user's data as one zip: conversations.json (ChatGPT's export shape), a Markdown file
per conversation with every branch, their documents' text and their memory facts; and
reading the documents and facts back from such a zip (an import restores them)."""

from __future__ import annotations

import io
import json
import re
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatbox.data.chatgpt import ImportRefused, to_chatgpt
from chatbox.store import Conversation, Document, Feedback, Memory, StoredResponse, Turn, User

SLACK = 16  # characters of whitespace a chunk may have lost at its start


@dataclass(frozen=True)
class ExportData:
    user: User
    conversations: Sequence[tuple[Conversation, list[Turn]]]
    documents: Sequence[tuple[Document, list[tuple[int | None, int, str]]]]
    memories: Sequence[Memory]
    feedback: Sequence[Feedback] = ()  # every rating the user gave, changes included
    responses: Sequence[StoredResponse] = ()  # the Responses API's stored answers


def slug(text: str | None, fallback: str) -> str:
    """A short, safe file name part (no path separators, no dots in front)."""
    words = re.sub(r"[^A-Za-z0-9]+", "-", text or "").strip("-").lower()
    return words[:48].strip("-") or fallback


def _when(ts: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))
    except (OverflowError, ValueError, OSError):  # a time no calendar holds
        return "an unknown time"


def branches(turns: list[Turn]) -> list[list[Turn]]:
    """Every root-to-leaf path of a conversation's tree, in the order they were written."""
    by_id = {t.id: t for t in turns}
    has_child = {t.parent_id for t in turns}
    out: list[list[Turn]] = []
    for leaf in (t for t in turns if t.id not in has_child):
        path: list[Turn] = []
        node: Turn | None = leaf
        while node is not None:
            path.append(node)
            node = by_id.get(node.parent_id) if node.parent_id else None
        out.append(path[::-1])
    return out


def markdown(conv: Conversation, turns: list[Turn]) -> str:
    """The conversation for people: its active branch first, then each other branch."""
    paths = branches(turns)
    paths.sort(key=lambda p: p[-1].id != conv.active_leaf_id)  # stable: the active one first
    lines = [f"# {conv.title or 'Untitled conversation'}", ""]
    lines += [f"- Started: {_when(conv.created_at)}", f"- Last active: {_when(conv.updated_at)}"]
    if conv.system_prompt:
        lines += ["", "## System prompt", "", conv.system_prompt]
    for n, path in enumerate(paths, 1):
        shown = " (the branch shown in chatbox)" if path[-1].id == conv.active_leaf_id else ""
        head = f"## Branch {n} of {len(paths)}{shown}" if len(paths) > 1 else "## Messages"
        lines += ["", head]
        for t in path:
            who = (
                "You" if t.role == "user" else f"Assistant ({t.model})" if t.model else "Assistant"
            )
            status = "" if t.status == "complete" else f" — {t.status}"
            lines += ["", f"### {who} · {_when(t.created_at)}{status}", "", t.content]
    return "\n".join(lines) + "\n"


def document_text(chunks: Sequence[tuple[int | None, int, str]]) -> str:
    """A document's text as chatbox read it, rejoined from its overlapping chunks
    ((page, offset in the page, text) each; a chunk's text may have lost leading spaces)."""
    out = ""
    page: int | None = -1
    end = 0  # where the text so far ends, as an offset in the page
    for at_page, start, text in chunks:
        if at_page != page:
            if out:
                out += f"\n\n--- page {at_page} ---\n\n" if at_page is not None else "\n\n"
            page, out, end = at_page, out + text, start + len(text)
            continue
        overlap = end - start
        if overlap <= 0:
            out += "\n" + text
        else:
            # The overlap is known up to the whitespace the chunker stripped: check it.
            fits = [
                k for k in range(overlap, max(-1, overlap - SLACK), -1) if out.endswith(text[:k])
            ]
            out += text[fits[0] :] if fits else "\n" + text
        end = max(end, start + len(text))
    return out


def build_zip(data: ExportData, now: float | None = None) -> bytes:
    """The whole export, as the bytes of a zip file."""
    at = time.time() if now is None else now
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        convs = [to_chatgpt(c, turns) for c, turns in data.conversations]
        zf.writestr("conversations.json", json.dumps(convs, ensure_ascii=False, indent=1))
        for n, (conv, turns) in enumerate(data.conversations, 1):
            name = f"conversations/{n:04d}-{slug(conv.title, conv.id)}.md"
            zf.writestr(name, markdown(conv, turns))
        docs: list[dict[str, Any]] = []
        for doc, chunks in data.documents:
            name = f"documents/{slug(doc.name, doc.id)}-{doc.id}.txt"
            zf.writestr(name, document_text(chunks))
            docs.append(
                {
                    "id": doc.id,
                    "name": doc.name,
                    "mime": doc.mime,
                    "conversation_id": doc.conversation_id,
                    "size_bytes": doc.size_bytes,
                    "created_at": doc.created_at,
                    "file": name,
                }
            )
        zf.writestr("documents/index.json", json.dumps(docs, ensure_ascii=False, indent=1))
        facts = [
            {
                "id": m.id,
                "text": m.text,
                "source": m.source,
                "conversation_id": m.conversation_id,
                "created_at": m.created_at,
            }
            for m in data.memories
        ]
        zf.writestr("memory.json", json.dumps(facts, ensure_ascii=False, indent=1))
        rated = [
            {
                "conversation_id": f.conversation_id,
                "turn_id": f.turn_id,
                "rating": f.rating,
                "comment": f.comment,
                "model": f.model,
                "created_at": f.created_at,
            }
            for f in data.feedback
        ]
        zf.writestr("feedback.json", json.dumps(rated, ensure_ascii=False, indent=1))
        answered = [
            {
                "id": r.id,
                "model": r.model,
                "created_at": r.created_at,
                "input": json.loads(r.input),
                "response": json.loads(r.output),
            }
            for r in data.responses
        ]
        zf.writestr("responses.json", json.dumps(answered, ensure_ascii=False, indent=1))
        zf.writestr(
            "memory.md",
            "# What chatbox remembers about you\n\n"
            + "".join(f"- {m.text} ({m.source})\n" for m in data.memories),
        )
        zf.writestr(
            "README.txt",
            f"chatbox export of {data.user.name}, made {_when(at)}.\n"
            f"{len(convs)} conversations (conversations.json: ChatGPT's export format; "
            "conversations/: one Markdown file each, every branch), "
            f"{len(docs)} documents (documents/), {len(facts)} memory facts (memory.json), "
            f"{len(answered)} stored API responses (responses.json).\n",
        )
    return buf.getvalue()


# -- reading an export's documents and memory back -----------------------------------------


@dataclass(frozen=True)
class DocumentIn:
    name: str
    text: str
    conversation_id: str | None  # the id it had in the export


@dataclass(frozen=True)
class FactIn:
    text: str
    source: str
    conversation_id: str | None  # the id it had in the export


@dataclass(frozen=True)
class Extras:
    """What a chatbox export holds besides its conversations."""

    documents: list[DocumentIn]
    facts: list[FactIn]


def _json_member(zf: zipfile.ZipFile, name: str, budget: list[int]) -> Any:
    body = _member(zf, name, budget)
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ImportRefused(f"{name} is not valid JSON") from exc


def _member(zf: zipfile.ZipFile, name: str, budget: list[int]) -> bytes:
    """A member's bytes, counted against the budget of unpacked bytes left."""
    with zf.open(name) as member:
        body = member.read(budget[0] + 1)
    budget[0] -= len(body)
    if budget[0] < 0:
        raise ImportRefused("the export unpacks to too many bytes")
    return body


def _str(item: dict[str, Any], key: str) -> str | None:
    value = item.get(key)
    return value if isinstance(value, str) else None


def read_extras(data: bytes, max_bytes: int) -> Extras:
    """The documents (as text) and memory facts of a chatbox export zip; none for any other
    file (read no further than max_bytes unpacked in all)."""
    if not data.startswith(b"PK"):
        return Extras([], [])
    budget = [max_bytes]
    docs: list[DocumentIn] = []
    facts: list[FactIn] = []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = set(zf.namelist())
            if "documents/index.json" in names:
                index = _json_member(zf, "documents/index.json", budget)
                for item in index if isinstance(index, list) else []:
                    file = _str(item, "file") if isinstance(item, dict) else None
                    if file is None or file not in names or not file.startswith("documents/"):
                        raise ImportRefused("documents/index.json names a file the zip lacks")
                    text = _member(zf, file, budget).decode("utf-8", errors="replace")
                    name = _str(item, "name") or file.rsplit("/", 1)[-1]
                    docs.append(DocumentIn(name, text, _str(item, "conversation_id")))
            if "memory.json" in names:
                raw = _json_member(zf, "memory.json", budget)
                for item in raw if isinstance(raw, list) else []:
                    fact = _str(item, "text") if isinstance(item, dict) else None
                    if fact is None:
                        raise ImportRefused("memory.json: each fact needs its text")
                    source = "extracted" if item.get("source") == "extracted" else "explicit"
                    facts.append(FactIn(fact, source, _str(item, "conversation_id")))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, RuntimeError, EOFError) as exc:
        raise ImportRefused(f"not a readable zip file ({exc})") from exc
    return Extras(docs, facts)
