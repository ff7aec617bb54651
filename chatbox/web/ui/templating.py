"""The Jinja environment's setup, done once when the app is built (never on a request).

`create_app` passes `configure_templates` as the `TemplateConfig`'s `engine_callback`, so
every template, whatever renders it first, sees the same filters and globals:

- `markdown` (filter): untrusted text → sanitized HTML (chatbox.web.ui.render);
- `urls` (global): the table of the UI's URLs (chatbox.web.urls), e.g. `urls.send(conv.id)`;
- `upload_accept` (global): the file types the attach and upload buttons offer.
"""

from __future__ import annotations

from litestar.plugins.jinja import JinjaTemplateEngine

from chatbox.web import urls
from chatbox.web.ui.render import markdown

# The file types the attach and upload buttons offer (the ingestion decides, not this list).
UPLOAD_ACCEPT = (
    ".txt,.text,.md,.markdown,.html,.htm,.pdf,text/plain,text/markdown,text/html,application/pdf"
)


def configure_templates(engine: JinjaTemplateEngine) -> None:
    """Register the UI's filters and globals on the app's Jinja environment."""
    jinja = engine.engine
    jinja.filters["markdown"] = markdown
    jinja.globals["urls"] = urls
    jinja.globals["upload_accept"] = UPLOAD_ACCEPT
    jinja.trim_blocks = jinja.lstrip_blocks = True  # leaner partials and SSE frames
