"""Markdown → safe HTML for model output and user messages (both untrusted text).

markdown-it-py ("commonmark" + tables + strikethrough, raw HTML off) renders, Pygments
colours fenced code of a known language; nh3 then sanitizes against an allow-list, so neither
a model nor a user can inject markup or script.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from typing import Any

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

_TAGS = {
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
_ATTRIBUTES = {
    "a": {"href", "title"},
    "code": {"class"},
    "span": {"class"},
    "pre": {"data-lang"},
    "ol": {"start"},
    "th": {"class"},
    "td": {"class"},
}
_MATH_CLASSES = {"math-inline", "math-display"}
_LANG = re.compile(r"^[A-Za-z0-9_+#.-]{1,32}$")
_TOKEN_CLASS = re.compile(r"^tok-[A-Za-z0-9]{1,4}$")  # Pygments' short token class names
_ALIGN = re.compile(r"^text-align:(left|right|center)$")
_ALIGN_CLASS = re.compile(r"^align-(left|right|center)$")


def _attribute_filter(tag: str, attr: str, value: str) -> str | None:
    """Keep only harmless values of the few attributes allowed."""
    if attr == "class" and tag == "span":  # Pygments token classes, or a math span
        return value if _TOKEN_CLASS.match(value) or value in _MATH_CLASSES else None
    if attr == "class" and tag in ("th", "td"):  # table alignment only
        return value if _ALIGN_CLASS.match(value) else None
    if attr == "class":  # code blocks: `language-xyz` only
        lang = value.removeprefix("language-")
        return value if value.startswith("language-") and _LANG.match(lang) else None
    if attr == "data-lang":
        return value if _LANG.match(value) else None
    if attr == "start":
        return value if value.isdigit() else None
    return value


_CLEANER = nh3.Cleaner(
    tags=_TAGS,
    clean_content_tags={"script", "style"},
    attributes=_ATTRIBUTES,
    attribute_filter=_attribute_filter,
    url_schemes={"http", "https", "mailto"},
    link_rel="noopener noreferrer nofollow",
    set_tag_attribute_values={"a": {"target": "_blank"}},
    strip_comments=True,
)


_FORMATTER = HtmlFormatter(nowrap=True, classprefix="tok-")


def _highlighted(code: str, lang: str) -> str:
    """Code as escaped HTML, with Pygments token spans when the language is known."""
    try:
        lexer = get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return html.escape(code)
    return str(highlight(code, lexer, _FORMATTER))


def _fence(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    """A fenced code block: `<pre data-lang=…><code class="language-…">`."""
    token = tokens[idx]
    lang = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
    if lang and _LANG.match(lang):
        body = _highlighted(token.content, lang)
        attr = html.escape(lang, quote=True)
        return f'<pre data-lang="{attr}"><code class="language-{attr}">{body}</code></pre>\n'
    return f"<pre><code>{html.escape(token.content)}</code></pre>\n"


# Math: $…$ and \(…\) inline, $$…$$ and \[…\] display. A $ opens only before a non-space
# and closes only after one, not before a digit, so "$5 and $10" stays text.
_MATH = (
    ("$$", "$$", True),
    ("\\[", "\\]", True),
    ("\\(", "\\)", False),
    ("$", "$", False),
)


def _bad_close(src: str, end: int) -> bool:
    """A single $ after a space or before a digit does not close math ("$5 and $10")."""
    return src[end - 1] in " \t\n" or src[end + 1 : end + 2].isdigit()


def _math(state: Any, silent: bool) -> bool:
    """Inline rule, before backslash escapes: a math span becomes one token holding its TeX
    as written (Markdown would eat `\\,` or `\\{`), typeset in the browser by KaTeX."""
    src: str = state.src
    pos: int = state.pos
    for opener, closer, display in _MATH:
        if not src.startswith(opener, pos):
            continue
        start = pos + len(opener)
        end = src.find(closer, start)
        while end != -1 and opener == "$" and _bad_close(src, end):
            end = src.find(closer, end + 1)
        if end == -1 or end == start:
            continue
        tex = src[start:end]
        if opener == "$" and (tex[0].isspace() or "\n\n" in tex):
            continue
        if not silent:
            token = state.push("math", "", 0)
            token.content = tex.strip()
            token.meta = {"display": display}
        state.pos = end + len(closer)
        return True
    return False


def _render_math(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    kind = "math-display" if token.meta.get("display") else "math-inline"
    return f'<span class="{kind}">{html.escape(token.content)}</span>'


def _align_classes(state: Any) -> None:
    """Table alignment as a class (`align-right`): a strict CSP refuses style attributes."""
    for token in state.tokens:
        if token.type in ("th_open", "td_open") and token.attrs.get("style") is not None:
            style = str(token.attrs.pop("style"))
            align = _ALIGN.match(style.replace(" ", ""))
            if align:
                token.attrSet("class", f"align-{align.group(1)}")


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True})
    md.enable(["table", "strikethrough"])
    md.disable("image")  # no remote images from an offline box; `![a](b)` stays a link
    md.add_render_rule("fence", _fence)
    md.inline.ruler.before("escape", "math", _math)
    md.add_render_rule("math", _render_math)
    md.core.ruler.push("align_classes", _align_classes)
    return md


def render_markdown(text: str) -> str:
    """Sanitized HTML for Markdown text (safe to insert as innerHTML)."""
    if not text:
        return ""
    return _CLEANER.clean(_parser().render(text))


def markdown(text: str | None) -> Markup:
    """Jinja helper: the rendered Markdown, marked safe (it is sanitized)."""
    return Markup(render_markdown(text or ""))
