"""Security headers on every response: a strict Content-Security-Policy and its companions.

The UI runs under the policy: no inline script, handler or style attribute in the templates
(behaviour lives in static/app.js, looks in static/app.css), and htmx is configured (the
`htmx-config` meta in base.html) not to eval, not to inject its indicator styles, and not to
settle `style` attributes (it would copy one that app.js set through the CSSOM).
"""

from __future__ import annotations

from litestar.types import Message, Scope

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",  # the favicon is a data: URL
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
# The OpenAPI viewers (/schema/…) are third-party pages with inline scripts: framing is still
# refused there, the rest of the policy is not applied.
SCHEMA_CSP = "frame-ancestors 'none'"

_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


async def security_headers(message: Message, scope: Scope) -> None:
    """A `before_send` hook: adds the headers to each HTTP response's start (every response,
    errors and static files included), leaving any a handler set itself."""
    if message["type"] != "http.response.start":
        return
    headers = list(message.get("headers") or [])
    present = {bytes(name).lower() for name, _ in headers}
    path = str(scope.get("path", ""))
    csp = SCHEMA_CSP if path == "/schema" or path.startswith("/schema/") else CSP
    for name, value in (*_HEADERS, (b"content-security-policy", csp.encode())):
        if name not in present:
            headers.append((name, value))
    message["headers"] = headers
