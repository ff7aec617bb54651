"""The Jinja setup happens when the app is built, and templates take every URL from one table."""

from __future__ import annotations

import re
from pathlib import Path

from jinja2 import Environment

import chatbox.web.urls as urls
from chatbox.app import TEMPLATES_DIR, create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.settings import Settings
from chatbox.web.ui.render import markdown
from chatbox.web.ui.templating import UPLOAD_ACCEPT

# Attributes that hold a URL the browser (or htmx) follows.
URL_ATTRS = (
    "href",
    "src",
    "action",
    "formaction",
    "hx-get",
    "hx-post",
    "hx-put",
    "hx-patch",
    "hx-delete",
    "hx-push-url",
    "hx-replace-url",
    "sse-connect",
)
_ATTR = re.compile(
    r"(?<![\w-])(" + "|".join(map(re.escape, URL_ATTRS)) + r""")\s*=\s*("[^"]*"|'[^']*')"""
)
_EXPR = re.compile(r"\{\{.*?\}\}", re.S)
_STMT = re.compile(r"\{%.*?%\}|\{#.*?#\}", re.S)
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.I)  # https:, mailto:, data:, //host


def hard_coded_urls(source: str) -> list[str]:
    """The URL attributes of a template that are not one `{{ … }}` (nor #anchor, nor external)."""
    # Jinja expressions may hold quotes of their own: reduce each to a placeholder first.
    text = _STMT.sub(" ", _EXPR.sub("{{}}", source))
    found = []
    for match in _ATTR.finditer(text):
        value = match.group(2)[1:-1].strip()
        if value == "{{}}" or value.startswith("#") or _EXTERNAL.match(value):
            continue
        found.append(match.group(0))
    return found


def jinja(settings: Settings, registry: ModelRegistry) -> Environment:
    app = create_app(settings, registry)
    assert app.template_engine is not None
    return app.template_engine.engine  # type: ignore[attr-defined,no-any-return]


def test_filters_and_globals_are_set_when_the_app_is_built(
    settings: Settings, registry: ModelRegistry
) -> None:
    env = jinja(settings, registry)  # no lifespan, no request
    assert env.filters["markdown"] is markdown
    assert env.globals["urls"] is urls
    assert env.globals["upload_accept"] == UPLOAD_ACCEPT
    assert env.trim_blocks and env.lstrip_blocks


def test_every_template_compiles_with_the_globals(
    settings: Settings, registry: ModelRegistry
) -> None:
    env = jinja(settings, registry)
    for path in sorted(TEMPLATES_DIR.glob("*.html")):
        env.get_template(path.name)


def test_templates_render_urls_from_the_table(settings: Settings, registry: ModelRegistry) -> None:
    env = jinja(settings, registry)

    class Hit:
        conversation_id, turn_id, title = "c1", "t1", "A chat"

    html = env.get_template("_search_results.html").render(
        q="a b/c&d", hits=[{"hit": Hit(), "html": "x"}]
    )
    assert 'href="/c/c1?turn=t1&amp;q=a%20b/c%26d#turn-t1"' in html

    class Run:
        conversation_id, turn_id, text, model = "c1", "t2", "", "tiny"

    html = env.get_template("_streaming.html").render(run=Run())
    assert 'sse-connect="/ui/c/c1/turns/t2/stream"' in html


def test_the_url_table() -> None:
    assert urls.home() == "/"
    assert urls.conversation("abc") == "/c/abc"
    assert urls.conversation("abc", turn="t9") == "/c/abc?turn=t9#turn-t9"
    assert urls.send("abc") == "/ui/c/abc/send"
    assert urls.stop("abc") == "/ui/c/abc/stop"
    assert urls.stream("abc", "t9") == "/ui/c/abc/turns/t9/stream"
    assert urls.static("app.css") == "/static/app.css"
    assert urls.static("vendor/htmx.min.js") == "/static/vendor/htmx.min.js"
    assert urls.login() == urls.login("/") == urls.login("/login") == "/login"
    assert urls.login("/c/abc") == "/login?next=/c/abc"
    assert urls.login("/c/a b") == "/login?next=/c/a%20b"
    assert urls.send("../x") == "/ui/c/..%2Fx/send"  # one segment stays one segment


# A sample argument for each path parameter of the table's functions.
_SAMPLE = {
    "conv_id": "c1",
    "turn_id": "t1",
    "doc_id": "d1",
    "fact_id": "f1",
    "chunk_id": 7,
    "path": "app.css",
    "trace_id": "0af7651916cd43dd8448eb211c80319c",
    "user_id": "u1",
    "action": "disable",
    "key_id": "k1",
    "name": "tiny",
    "chat_id": "tmp_1",
    "token": "tok",
    "share_id": "s1",
    "ws_id": "w1",
    "item_id": "m1",
}


def _table() -> list[tuple[str, str]]:
    import inspect

    out = []
    for name, fn in vars(urls).items():
        if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != urls.__name__:
            continue
        params = inspect.signature(fn).parameters
        args = [
            _SAMPLE[p.name]
            for p in params.values()
            if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
        ]
        out.append((name, fn(*args)))
    return out


def test_every_url_of_the_table_is_a_route(settings: Settings, registry: ModelRegistry) -> None:
    app = create_app(settings, registry)
    routes = [
        re.sub(
            r"\\\{[^}]*:path\\\}",
            ".+",  # e.g. /static/{file_path:path}
            re.sub(r"\\\{[^}]*:[a-z]+\\\}", "[^/]+", re.escape(route.path)),
        )
        for route in app.routes
    ]
    table = _table()
    assert len(table) >= 30
    for name, url in table:
        path = url.split("?")[0].split("#")[0]
        assert any(re.fullmatch(r, path) for r in routes), f"urls.{name}() = {url}: no route"


def test_no_template_hard_codes_an_app_path() -> None:
    offenders = {
        path.name: bad
        for path in sorted(Path(TEMPLATES_DIR).glob("**/*.html"))
        if (bad := hard_coded_urls(path.read_text()))
    }
    assert not offenders, f"use the `urls` global instead: {offenders}"


def test_the_check_catches_hard_coded_paths() -> None:
    assert hard_coded_urls('<a href="/c/{{ c.id }}">') == ['href="/c/{{}}"']
    assert hard_coded_urls('<form hx-post="/ui/new/send" action="ui/x">') == [
        'hx-post="/ui/new/send"',
        'action="ui/x"',
    ]
    assert hard_coded_urls("""<script src='/static/app.js'></script>""")
    assert hard_coded_urls('<a href="{{ urls.conversation(c.id) }}/more">')
    assert not hard_coded_urls("""<link href="{{ urls.static("app.css") }}">""")
    assert not hard_coded_urls('<a href="#turn-{{ t.id }}"><a href="https://example.org/x">')
    assert not hard_coded_urls('<link rel="icon" href="data:image/svg+xml,%3Csvg%3E">')
    assert not hard_coded_urls('<div hx-vals=\'{{ {"turn_id": t}|tojson }}\' data-x="/y">')
