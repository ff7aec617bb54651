"""Markdown rendering of untrusted text (model output, user messages) and its sanitizing."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from chatbox.web.ui.render import markdown, render_markdown

ALLOWED = {
    "p",
    "br",
    "hr",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "strong",
    "em",
    "s",
    "del",
    "code",
    "pre",
    "blockquote",
    "ul",
    "ol",
    "li",
    "a",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "span",
}


class _Elements(HTMLParser):
    """Every element and attribute in a fragment, as a browser would parse it."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


def elements(fragment: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Elements()
    parser.feed(fragment)
    return parser.found


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def text_of(fragment: str) -> str:
    parser = _Text()
    parser.feed(fragment)
    parser.close()
    return "".join(parser.parts).strip("\n") + "\n"


def test_commonmark_basics() -> None:
    out = render_markdown("# Title\n\nSome **bold**, *em* and `code`.\n\n- a\n- b")
    assert "<h1>Title</h1>" in out
    assert "<strong>bold</strong>" in out and "<em>em</em>" in out
    assert "<code>code</code>" in out
    assert "<ul>" in out and "<li>a</li>" in out


def test_fenced_code_keeps_language_and_escapes_content() -> None:
    out = render_markdown('```python\nprint("<b>hi</b>")\n```')
    assert '<pre data-lang="python"><code class="language-python">' in out
    assert "&lt;b&gt;hi&lt;/b&gt;" in out
    assert "<b>" not in out


def test_code_of_a_known_language_is_highlighted() -> None:
    out = render_markdown('```python\ndef f(x):\n    return "hi"  # done\n```')
    assert '<span class="tok-k">def</span>' in out
    assert '<span class="tok-nf">f</span>' in out
    assert '<span class="tok-s2">&quot;hi&quot;</span>' in out or 'tok-s2">"hi"' in out
    assert '<span class="tok-c1"># done</span>' in out
    assert text_of(out) == 'def f(x):\n    return "hi"  # done\n'  # the code, whole
    # An unknown language is plain, escaped text.
    plain = render_markdown("```klingon\nqapla' <b>\n```")
    assert "<span" not in plain and "&lt;b&gt;" in plain


def test_fence_without_language_and_indented_code() -> None:
    assert render_markdown("```\nx = 1\n```") == "<pre><code>x = 1\n</code></pre>\n"
    assert "<pre><code>y = 2" in render_markdown("    y = 2")


def test_tables_and_strikethrough() -> None:
    out = render_markdown("| a | b |\n|:--|--:|\n| 1 | 2 |\n\n~~gone~~")
    assert "<table>" in out and "<th" in out and "<td" in out
    assert 'class="align-right"' in out and "style=" not in out  # no inline style (CSP)
    assert "<s>gone</s>" in out


def test_safe_links_open_in_new_tab() -> None:
    out = render_markdown("[docs](https://example.com/x)")
    assert 'href="https://example.com/x"' in out
    assert 'rel="noopener noreferrer nofollow"' in out
    assert 'target="_blank"' in out


@pytest.mark.parametrize(
    "text",
    [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        '<a href="javascript:alert(1)">x</a>',
        "[click](javascript:alert(1))",
        "[click](JaVaScRiPt:alert(1))",
        "[click](  javascript:alert(1))",
        "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
        "[click](vbscript:msgbox(1))",
        '<iframe src="https://evil.example"></iframe>',
        '<svg onload="alert(1)"></svg>',
        '<div style="background:url(javascript:alert(1))">x</div>',
        '```x" onmouseover="alert(1)\ncode\n```',
        '<p onclick="alert(1)">x</p>',
        "![x](https://tracker.example/pixel.png)",
        "```html\n<script>alert(1)</script><img src=x onerror=alert(1)>\n```",
        '```python\nx = "</code></pre><script>alert(1)</script>"\n```',
    ],
)
def test_untrusted_html_is_neutralised(text: str) -> None:
    out = render_markdown(text)
    for tag, attrs in elements(out):
        assert tag in ALLOWED, out
        for name, value in attrs.items():
            assert not name.startswith("on"), out
            assert name in {"href", "title", "class", "data-lang", "start", "rel", "target"}, out
            if name == "href":
                assert (value or "").startswith(("http://", "https://", "mailto:")), out
            if tag in ("th", "td"):
                assert value in {"align-left", "align-right", "align-center"}, out
            if tag == "span":
                assert list(attrs) == ["class"] and (attrs["class"] or "").startswith("tok-")


def test_raw_html_shows_as_text() -> None:
    out = render_markdown("Use <b>bold</b> & <script>x()</script>")
    assert "&lt;b&gt;bold&lt;/b&gt;" in out
    assert "&lt;script&gt;" in out
    assert "&amp;" in out


def test_partial_markdown_while_streaming_is_well_formed() -> None:
    out = render_markdown("Here:\n```python\ndef f(")
    assert out.count("<pre") == out.count("</pre>") == 1


def test_empty_and_jinja_helper() -> None:
    assert render_markdown("") == ""
    assert str(markdown(None)) == ""
    assert str(markdown("*x*")) == "<p><em>x</em></p>\n"


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("a thin space $a\\,b$ here", ['<span class="math-inline">a\\,b</span>']),
        ("sets \\(\\{x\\}\\) and", ['<span class="math-inline">\\{x\\}</span>']),
        (
            "$$\\frac{1}{2}\\,\\text{cm}$$",
            ['<span class="math-display">\\frac{1}{2}\\,\\text{cm}</span>'],
        ),
        ("\\[a_1 * b_2 * c\\]", ['<span class="math-display">a_1 * b_2 * c</span>']),
        ("$x < y$", ['<span class="math-inline">x &lt; y</span>']),
    ],
)
def test_math_keeps_its_tex_for_katex(text: str, spans: list[str]) -> None:
    html = render_markdown(text)
    for span in spans:
        assert span in html, html


@pytest.mark.parametrize(
    "text", ["costs $5 and $10", "`$x$` in code", "```\n$$a\\,b$$\n```", "a $ b $ c"]
)
def test_dollars_that_are_not_math_stay_text(text: str) -> None:
    assert "math-" not in render_markdown(text)


def test_a_math_span_cannot_smuggle_markup() -> None:
    html = render_markdown('$<script>alert(1)</script>$ and $x" onclick="y$')
    assert "<script" not in html
    assert '<span class="math-inline">x" onclick="y</span>' in html  # text, not an attribute
