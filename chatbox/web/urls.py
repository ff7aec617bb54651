"""Building the app's URLs: every path comes from Litestar's reversal of a named route.

Handlers name their routes (`name=`); code calls `reverse(request, name, **params)` and
templates `url_for(name, **params)`. This module holds only what reversal does not: each
path segment percent-encoded (a '/' in a value cannot reach another route), query strings,
and the fragment that scrolls a conversation to a turn.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from jinja2 import pass_context
from litestar import Litestar, Request
from litestar.template.base import url_for as litestar_url_for


def _segments(app: Litestar, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Each text value percent-encoded as one path segment, but for a `:path` parameter,
    whose slashes are its own (numbers pass as they are)."""
    index = app.get_handler_index_by_name(name)
    paths = " ".join(index["handler"].paths) if index else ""
    whole = set(re.findall(r"\{(\w+):path\}", paths))
    return {
        k: quote(v, safe="/" if k in whole else "") if isinstance(v, str) else v
        for k, v in params.items()
    }


def reverse(request: Request[Any, Any, Any], name: str, /, **params: Any) -> str:
    """The path of the route named `name`, with its path parameters filled in."""
    return request.app.route_reverse(name, **_segments(request.app, name, params))


@pass_context
def url_for(context: Any, name: str, /, **params: Any) -> str:
    """Templates' `url_for`: Litestar's, with each path segment percent-encoded."""
    app = context["request"].app
    return litestar_url_for(context, name, **_segments(app, name, params))


def query(url: str, /, **params: str | None) -> str:
    """`url` with a query string of the given parameters (those that are None left out)."""
    given = "&".join(f"{k}={quote(v, safe='/')}" for k, v in params.items() if v is not None)
    return f"{url}?{given}" if given else url


def at_turn(url: str, turn: str, q: str | None = None) -> str:
    """A conversation page's URL scrolled to `turn` (and `q` highlighted there)."""
    mark = quote(turn, safe="")
    more = f"&q={quote(q, safe='/')}" if q else ""  # as Jinja's `urlencode` filter quotes
    return f"{url}?turn={mark}{more}#turn-{mark}"
