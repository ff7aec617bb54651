"""The Jinja environment's setup, done once when the app is built (never on a request).

`create_app` passes `configure_templates` as the `TemplateConfig`'s `engine_callback`, so
every template, whatever renders it first, sees the same filters and globals:

- `markdown` (filter): untrusted text → sanitized HTML (chatbox.web.ui.render);
- `url_for` (global): a named route's path, e.g. `url_for('send', conv_id=conv.id)` (Litestar's,
  each segment percent-encoded: chatbox.web.urls);
- `query`, `at_turn` (filters): a query string, a conversation scrolled to a turn;
- `upload_accept` (global): the file types the attach and upload buttons offer;
- `tool_steps` (filter): an answer's tool turns → their collapsed blocks;
- `when` (filter): a Unix time → a `<time datetime>` in UTC that app.js rewrites in the
  viewer's own locale and time zone.

Compiled templates are kept in `<cache_dir>/templates` (Jinja's bytecode cache, checked
against each template's source), so a box just started does not compile every page again
on its first requests; a cache that cannot be read or written is skipped.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import jinja2
from jinja2.bccache import Bucket, FileSystemBytecodeCache
from litestar.plugins.jinja import JinjaTemplateEngine
from markupsafe import Markup

from chatbox import __version__
from chatbox.web.ui.render import markdown
from chatbox.web.ui.tool_steps import steps_from_turns, steps_html
from chatbox.web.urls import at_turn, query, url_for

# The file types the attach and upload buttons offer (the ingestion decides, not this list).
UPLOAD_ACCEPT = (
    ".txt,.text,.md,.markdown,.html,.htm,.pdf,text/plain,text/markdown,text/html,application/pdf"
)


def when(epoch: float | int | None) -> Markup:
    """A moment as `<time datetime>`: UTC text until app.js shows it in the viewer's zone."""
    if epoch is None:
        return Markup("")
    stamp = time.gmtime(float(epoch))
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", stamp)
    return Markup('<time class="local-time" datetime="{}">{}</time>').format(
        iso, time.strftime("%Y-%m-%d %H:%M UTC", stamp)
    )


class TemplateCache(FileSystemBytecodeCache):
    """Jinja's bytecode files in a directory, where a disk error only means compiling again."""

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except (OSError, ValueError, EOFError):  # unreadable, or cut short
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        try:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:
            pass


def configure_templates(engine: JinjaTemplateEngine, cache_dir: Path | None = None) -> None:
    """Register the UI's filters and globals on the app's Jinja environment, and keep its
    compiled templates under `cache_dir` when given."""
    jinja = engine.engine
    jinja.filters["markdown"] = markdown
    jinja.filters["when"] = when
    jinja.filters["tool_steps"] = lambda turns: steps_html(steps_from_turns(turns))
    jinja.globals["url_for"] = url_for
    jinja.filters["query"] = query
    jinja.filters["at_turn"] = at_turn
    jinja.globals["upload_accept"] = UPLOAD_ACCEPT
    jinja.trim_blocks = jinja.lstrip_blocks = True  # leaner partials and SSE frames
    if cache_dir is not None:
        # What else shapes the compiled code names the files: Jinja's version, chatbox's (its
        # filters and options) and the whitespace options.
        shape = f"{jinja2.__version__} {__version__} {jinja.trim_blocks} {jinja.lstrip_blocks}"
        tag = hashlib.sha256(shape.encode()).hexdigest()[:12]
        jinja.bytecode_cache = TemplateCache(
            str(cache_dir / "templates"), pattern=f"%s-{tag}.cache"
        )
