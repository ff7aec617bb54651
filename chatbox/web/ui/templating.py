"""The Jinja environment's setup, done once when the app is built (never on a request).

`create_app` passes `configure_templates` as the `TemplateConfig`'s `engine_callback`, so
every template, whatever renders it first, sees the same filters and globals:

- `markdown` (filter): untrusted text → sanitized HTML (chatbox.web.ui.render);
- `urls` (global): the table of the UI's URLs (chatbox.web.urls), e.g. `urls.send(conv.id)`;
- `upload_accept` (global): the file types the attach and upload buttons offer;
- `tool_steps` (filter): an answer's tool turns → their collapsed blocks;
- `when` (filter): a Unix time → a `<time datetime>` in UTC that app.js rewrites in the
  viewer's own locale and time zone.
"""

from __future__ import annotations

import time

from litestar.plugins.jinja import JinjaTemplateEngine
from markupsafe import Markup

import chatbox.web.urls as urls
from chatbox.web.ui.render import markdown
from chatbox.web.ui.tool_steps import steps_from_turns, steps_html

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


def configure_templates(engine: JinjaTemplateEngine) -> None:
    """Register the UI's filters and globals on the app's Jinja environment."""
    jinja = engine.engine
    jinja.filters["markdown"] = markdown
    jinja.filters["when"] = when
    jinja.filters["tool_steps"] = lambda turns: steps_html(steps_from_turns(turns))
    jinja.globals["urls"] = urls
    jinja.globals["upload_accept"] = UPLOAD_ACCEPT
    jinja.trim_blocks = jinja.lstrip_blocks = True  # leaner partials and SSE frames
