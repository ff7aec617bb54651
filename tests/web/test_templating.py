"""The Jinja setup happens when the app is built, and every URL comes from a named route."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from jinja2 import Environment, nodes
from litestar import Litestar
from litestar.exceptions import NoRouteMatchFoundException

import chatbox
from chatbox.app import TEMPLATES_DIR, create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.settings import Settings
from chatbox.web.ui.render import markdown
from chatbox.web.ui.templating import UPLOAD_ACCEPT
from chatbox.web.urls import at_turn, query, reverse, url_for

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
    return engine(create_app(settings, registry))


def engine(app: Litestar) -> Environment:
    assert app.template_engine is not None
    return app.template_engine.engine  # type: ignore[attr-defined,no-any-return]


def test_filters_and_globals_are_set_when_the_app_is_built(
    settings: Settings, registry: ModelRegistry
) -> None:
    env = jinja(settings, registry)  # no lifespan, no request
    assert env.filters["markdown"] is markdown
    assert env.globals["url_for"] is url_for
    assert env.filters["query"] is query and env.filters["at_turn"] is at_turn
    assert env.globals["upload_accept"] == UPLOAD_ACCEPT
    assert env.trim_blocks and env.lstrip_blocks


def test_every_template_compiles_with_the_globals(
    settings: Settings, registry: ModelRegistry
) -> None:
    env = jinja(settings, registry)
    for path in sorted(TEMPLATES_DIR.glob("*.html")):
        env.get_template(path.name)


def test_compiled_templates_are_kept_for_the_next_start(
    settings: Settings, registry: ModelRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = replace(settings, cache_dir=tmp_path / "cache")
    jinja(kept, registry).get_template("_chat.html")
    assert list((tmp_path / "cache" / "templates").glob("*.cache"))

    compiled: list[str | None] = []
    compile_source = Environment.compile

    def counted(self: Environment, source: Any, name: str | None = None, *a: Any) -> Any:
        compiled.append(name)
        return compile_source(self, source, name, *a)

    monkeypatch.setattr(Environment, "compile", counted)
    again = jinja(kept, registry)  # the next start, on the same cache directory
    assert again.get_template("_chat.html").render  # loaded, not compiled
    assert compiled == []
    again.get_template("_header.html")  # one the first start never loaded
    assert compiled == ["_header.html"]


def test_a_template_cache_that_cannot_be_written_is_skipped(
    settings: Settings, registry: ModelRegistry, tmp_path: Path
) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "templates").write_text("a file where the directory would be")
    env = jinja(replace(settings, cache_dir=tmp_path / "cache"), registry)
    for path in sorted(TEMPLATES_DIR.glob("*.html")):
        env.get_template(path.name)


def test_templates_render_urls_by_reversing_routes(
    settings: Settings, registry: ModelRegistry
) -> None:
    app = create_app(settings, registry)
    env, request = engine(app), SimpleNamespace(app=app)

    class Hit:
        conversation_id, turn_id, title = "c1", "t1", "A chat"

    group = {"id": "c1", "title": "A chat", "hits": [{"hit": Hit(), "html": "x"}]}
    html = env.get_template("_search_results.html").render(
        request=request, q="a b/c&d", groups=[group]
    )
    assert 'href="/c/c1?turn=t1&amp;q=a%20b/c%26d#turn-t1"' in html

    class Run:
        conversation_id, turn_id, text, model = "c1", "t2", "", "tiny"

    html = env.get_template("_streaming.html").render(request=request, run=Run())
    assert 'sse-connect="/ui/c/c1/turns/t2/stream"' in html


def test_reversal(settings: Settings, registry: ModelRegistry) -> None:
    request: Any = SimpleNamespace(app=create_app(settings, registry))
    assert reverse(request, "home") == "/"
    assert reverse(request, "conversation", conv_id="abc") == "/c/abc"
    assert at_turn("/c/abc", "t9") == "/c/abc?turn=t9#turn-t9"
    assert reverse(request, "send", conv_id="abc") == "/ui/c/abc/send"
    assert reverse(request, "stream", conv_id="abc", turn_id="t9") == "/ui/c/abc/turns/t9/stream"
    assert reverse(request, "static", file_path="app.css") == "/static/app.css"
    assert (
        reverse(request, "static", file_path="vendor/htmx.min.js") == "/static/vendor/htmx.min.js"
    )
    assert reverse(request, "passage", chunk_id=7) == "/ui/passages/7"
    assert reverse(request, "temporary_send", conv_id="tmp_1") == "/ui/temporary/tmp_1/send"
    assert query("/", workspace="w 1", none=None) == "/?workspace=w%201"
    assert reverse(request, "send", conv_id="../x") == "/ui/c/..%2Fx/send"  # one segment
    with pytest.raises(NoRouteMatchFoundException):
        reverse(request, "no_such_route")


_CALLS = re.compile(r"""\breverse\(\s*request,\s*"(\w+)"((?:,\s*\w+=[^,()]+(?:\([^()]*\))?)*)""")


def named_routes(env: Environment, source: str) -> list[tuple[str | None, list[str]]]:
    """Each `url_for` call of a template: the route it names (None: not a literal), and the
    names of the parameters it passes."""
    calls = []
    for call in env.parse(source).find_all(nodes.Call):
        if isinstance(call.node, nodes.Name) and call.node.name == "url_for":
            first = call.args[0] if call.args else None
            name = first.value if isinstance(first, nodes.Const) else None
            calls.append((name, sorted(k.key for k in call.kwargs)))
    return calls


def route_problems(app: Litestar, calls: list[tuple[str | None, list[str]]]) -> list[str]:
    """What is wrong with each named route: unknown, or not given its path parameters."""
    problems = []
    for name, given in calls:
        index = app.get_handler_index_by_name(name) if name else None
        if index is None:
            problems.append(f"{name}: no such route")
            continue
        if "name" in given:  # route_reverse takes `name` itself
            problems.append(f"{name}: a path parameter called name cannot be reversed")
            continue
        wanted = {tuple(sorted(re.findall(r"\{(\w+):", path))) for path in index["handler"].paths}
        if tuple(given) not in wanted:
            problems.append(f"{name}: given {given}, wants one of {sorted(wanted)}")
    return problems


def test_every_route_a_template_names_exists(settings: Settings, registry: ModelRegistry) -> None:
    app = create_app(settings, registry)
    env = engine(app)
    found = {
        path.name: calls
        for path in sorted(Path(TEMPLATES_DIR).glob("**/*.html"))
        if (calls := named_routes(env, path.read_text()))
    }
    assert sum(len(c) for c in found.values()) >= 60
    problems = {n: bad for n, calls in found.items() if (bad := route_problems(app, calls))}
    assert not problems


def test_every_route_the_code_reverses_exists(settings: Settings, registry: ModelRegistry) -> None:
    app = create_app(settings, registry)
    calls = [
        (m.group(1), sorted(re.findall(r"(\w+)=", m.group(2))))
        for path in sorted(Path(chatbox.__file__).parent.glob("web/**/*.py"))
        for m in _CALLS.finditer(path.read_text())
    ]
    assert len(calls) >= 8
    assert not route_problems(app, calls)


def test_the_route_check_catches_a_wrong_name(settings: Settings, registry: ModelRegistry) -> None:
    app = create_app(settings, registry)
    calls = named_routes(
        engine(app),
        "{{ url_for('no_such_route') }}{{ url_for(name) }}{{ url_for('send', turn_id=t) }}"
        "{{ url_for('send', conv_id=c) }}{{ url_for('send', name=c) }}",
    )
    assert route_problems(app, calls) == [
        "no_such_route: no such route",
        "None: no such route",
        "send: given ['turn_id'], wants one of [('conv_id',)]",
        "send: a path parameter called name cannot be reversed",
    ]


def test_no_template_hard_codes_an_app_path() -> None:
    offenders = {
        path.name: bad
        for path in sorted(Path(TEMPLATES_DIR).glob("**/*.html"))
        if (bad := hard_coded_urls(path.read_text()))
    }
    assert not offenders, f"use url_for instead: {offenders}"


def test_the_check_catches_hard_coded_paths() -> None:
    assert hard_coded_urls('<a href="/c/{{ c.id }}">') == ['href="/c/{{}}"']
    assert hard_coded_urls('<form hx-post="/ui/new/send" action="ui/x">') == [
        'hx-post="/ui/new/send"',
        'action="ui/x"',
    ]
    assert hard_coded_urls("""<script src='/static/app.js'></script>""")
    assert hard_coded_urls("""<a href="{{ url_for('conversation', conv_id=c.id) }}/more">""")
    assert not hard_coded_urls("""<link href="{{ url_for("static", file_path="app.css") }}">""")
    assert not hard_coded_urls('<a href="#turn-{{ t.id }}"><a href="https://example.org/x">')
    assert not hard_coded_urls('<link rel="icon" href="data:image/svg+xml,%3Csvg%3E">')
    assert not hard_coded_urls('<div hx-vals=\'{{ {"turn_id": t}|tojson }}\' data-x="/y">')
