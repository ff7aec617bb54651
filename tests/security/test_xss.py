"""An XSS corpus through every place user or model text is shown.

Each payload goes in as a Markdown answer (the renderer directly, and a stored answer shown
on /c/{id}), a user message, a conversation title (sidebar, header, <title>), a document
name (library, chips, sources, passage), a memory fact (/memory), a search snippet and
query (/ui/search), and an error alert. The HTML that comes back is parsed: no script the
app did not write, no event-handler attribute carrying the payload, no javascript:/data:
URL, and no template expression evaluated.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from litestar.testing import TestClient

from chatbox.web.ui.render import render_markdown
from tests.security.conftest import Cast, send_turn

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.store_agnostic("how each page escapes the text it is given"),
]

CORPUS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    '"><svg onload=alert(3)>',
    "'><svg/onload=alert(4)>",
    "[click](javascript:alert(5))",
    "[click](JaVaScRiPt:alert(6))",
    "[click](jav&#x09;ascript:alert(7))",
    "[click](  javascript:alert(8))",
    "![pic](javascript:alert(9))",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxMCk8L3NjcmlwdD4=)",
    "[click](vbscript:alert(11))",
    '<a href="javascript:alert(12)">x</a>',
    "<iframe src=javascript:alert(13)></iframe>",
    "<details open ontoggle=alert(14)>",
    '<div hx-get="/logout" hx-trigger="load" hx-on::load="alert(15)">x</div>',
    "zq{{7*7}}zq",
    "zq{% print(7*7) %}zq",
    "zq${7*7}zq",
    "\uff1cscript\uff1ealert(16)\uff1c/script\uff1e",  # fullwidth < > (NFKC makes <script>)
    "\u202egnp.exe<img src=x onerror=alert(17)>",  # right-to-left override
    "<scr\u0000ipt>alert(18)</scr\u0000ipt>",
    "&lt;script&gt;alert(19)&lt;/script&gt;",  # double-decoding
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(20)>",
    '<a href="&#106;avascript:alert(21)">x</a>',
    "`<script>alert(22)</script>`",
    "```html\n<script>alert(23)</script>\n```",
    '<form action="javascript:alert(24)"><button>x</button></form>',
    '<base href="//evil.example/">',
    '<meta http-equiv="refresh" content="0;url=javascript:alert(25)">',
]

URL_ATTRS = {
    "href",
    "src",
    "action",
    "formaction",
    "xlink:href",
    "data",
    "poster",
    "background",
    "hx-get",
    "hx-post",
    "hx-put",
    "hx-patch",
    "hx-delete",
    "sse-connect",
    "srcdoc",
}
FORBIDDEN_TAGS = {"iframe", "object", "embed", "base", "frame", "frameset", "applet"}
MARKER = re.compile(r"alert\(|zq49zq")


class _Audit(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self._script: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            src = dict(attrs).get("src")
            if src is not None and not src.startswith("/static/"):
                self.problems.append(f"<script src={src!r}>")
            self._script = ""
        if tag in FORBIDDEN_TAGS:
            self.problems.append(f"<{tag}>")
        if tag == "meta" and any(k == "http-equiv" for k, _ in attrs):
            self.problems.append("<meta http-equiv>")
        for name, value in attrs:
            value = value or ""
            if (name.startswith("on") or name.startswith("hx-on")) and MARKER.search(value):
                self.problems.append(f"<{tag} {name}={value!r}>")
            if name in URL_ATTRS:
                squashed = re.sub(r"[\x00-\x20]", "", value).lower()
                if squashed.startswith(("javascript:", "vbscript:", "data:text/html")):
                    self.problems.append(f"<{tag} {name}={value!r}>")
            if name in ("hx-vals", "hx-headers") and "js:" in value:
                self.problems.append(f"<{tag} {name}={value!r}>")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            if MARKER.search(self._script):
                self.problems.append(f"<script>{self._script[:60]}</script>")
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._script += data
        if "zq49zq" in data:
            self.problems.append("a template expression was evaluated (zq49zq)")


def audit(html: str) -> list[str]:
    parser = _Audit()
    parser.feed(html)
    parser.close()
    if "zq49zq" in html:
        parser.problems.append("a template expression was evaluated (zq49zq)")
    return parser.problems


def test_the_auditor_catches_what_it_is_for() -> None:
    assert audit("<p><img src=x onerror=alert(1)></p>")
    assert audit('<a href=" jav\tascript:alert(1)">x</a>')
    assert audit("<script>alert(1)</script>")
    assert audit("<p>zq49zq</p>")
    assert not audit(
        '<script src="/static/app.js" defer></script>'
        '<form onsubmit="return false"></form><p>&lt;script&gt;alert(1)</p>'
    )


@pytest.mark.parametrize("payload", CORPUS)
def test_markdown_renderer_emits_no_executable_markup(payload: str) -> None:
    out = str(render_markdown(payload))
    assert not audit(out), (payload, out)
    assert not audit(str(render_markdown(f"Some text\n\n> {payload}\n\n* {payload}\n")))


def _store_answer(client: TestClient, conv_id: str, user_turn: str, text: str) -> str:
    """Store `text` as a finished answer to `user_turn` (what a model could have written)."""
    from chatbox.store.records import TurnUsage

    store = client.app.state.services.store

    async def write() -> str:
        draft = await store.turns.start_draft(conv_id, user_turn, None)
        turn = await store.turns.finish_draft(draft, "complete", text, TurnUsage())
        return str(turn.id)

    return str(client.blocking_portal.call(write))


def _pages(
    client: TestClient, h: dict[str, str], conv_id: str, answer: str, chunk_id: int | None, q: str
) -> dict[str, Any]:
    pages: dict[str, Any] = {
        "/": client.get("/", headers=h),
        f"/c/{conv_id}": client.get(f"/c/{conv_id}", headers=h),
        "/library": client.get("/library", headers=h),
        "/memory": client.get("/memory", headers=h),
        "sources": client.get(f"/ui/c/{conv_id}/turns/{answer}/sources", headers=h),
        "/ui/search (the payload)": client.get("/ui/search", params={"q": q}, headers=h),
        "/ui/search (a word)": client.get("/ui/search", params={"q": "xsscanary"}, headers=h),
        "stream": client.get(f"/ui/c/{conv_id}/turns/{answer}/stream", headers=h),
        "turn": client.get(f"/ui/c/{conv_id}/turns/{answer}", headers=h),
    }
    if chunk_id is not None:
        pages["passage"] = client.get(f"/ui/passages/{chunk_id}", headers=h)
    return pages


def test_corpus_through_every_page(cast: Cast) -> None:
    client, h = cast.client, cast.bob  # paid: 29 turns with passages fit its budget
    problems: list[str] = []
    for i, payload in enumerate(CORPUS):
        # Titles, user messages, answers, document names, facts, search snippets.
        conv = client.post("/v1/conversations", headers=h, json={"title": f"{payload} {i}"}).json()[
            "id"
        ]
        doc_text = f"xsscanary {payload} pump manual. " * 30
        r = client.post(
            f"/v1/conversations/{conv}/documents",
            headers=h,
            files={"file": (f"{payload}.txt", doc_text.encode(), "text/plain")},
        )
        assert r.status_code in (201, 413, 415, 422), r.text
        asked, first, got = send_turn(client, h, conv, f"xsscanary pump {payload}")
        cites = [e.json() for e in got if e.event == "citations"]
        chunk = int(cites[0]["citations"][0]["chunk_id"]) if cites else None
        answer = _store_answer(
            client, conv, asked, f"Here you go:\n\n{payload}\n\nxsscanary {payload}"
        )
        client.post(
            "/v1/documents",
            headers=h,
            files={"file": (f"lib {payload}.md", doc_text.encode(), "text/markdown")},
        )
        client.patch("/v1/users/me/memory", headers=h, json={"add": [f"Likes {payload}"]})
        for where, r in _pages(client, h, conv, answer, chunk, payload).items():
            assert r.status_code < 500, (where, r.status_code, r.text[:300])
            for p in audit(r.text):
                problems.append(f"{payload!r} on {where}: {p}")
        # Error alerts that echo what was sent: a refused file, an unknown model.
        for where, r in {
            "attach refused": client.post(
                f"/ui/c/{conv}/documents",
                headers=h,
                files={"file": (f"{payload}.png", b"\x89PNG\r\n" + bytes(64), "image/png")},
            ),
            "library refused": client.post(
                "/ui/library/documents",
                headers=h,
                files={"file": (f"{payload}.txt", b"", "text/plain")},
            ),
            "sources of the cited answer": client.get(
                f"/ui/c/{conv}/turns/{first}/sources", headers=h
            ),
            "unknown model": client.post(
                "/ui/new/send", headers=h, data={"content": "hi", "model": payload}
            ),
            "settings": client.post(
                f"/ui/c/{conv}/settings", headers=h, data={"title": payload, "model": payload}
            ),
            "memory add": client.post(
                "/ui/memory/add", headers=h, data={"text": f"Lives in {payload}"}
            ),
        }.items():
            assert r.status_code < 500, (where, r.status_code, r.text[:300])
            for p in audit(r.text):
                problems.append(f"{payload!r} in {where}: {p}")
        client.delete(f"/v1/conversations/{conv}", headers=h)
    assert not problems, "executable markup reached the HTML:\n  " + "\n  ".join(problems)
