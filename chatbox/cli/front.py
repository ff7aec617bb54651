"""The CLI's calls to a running server's admin API (`chatbox replicas`, `chatbox doctor`,
`chatbox shadow`, `chatbox eval run --server`)."""

from __future__ import annotations

import json
from typing import Any

import click


def admin_call(
    front: str, key: str | None, method: str, path: str, timeout: float = 60, **kwargs: Any
) -> Any:
    """`method path` on the server at `front` with an admin's key; its JSON, or a
    ClickException naming the status and the server's reason."""
    import httpx  # only commands that talk to a server load it

    if not key:
        raise click.ClickException("an admin API key is needed: --key or CHATBOX_ADMIN_KEY")
    # A long wait for the answer (an eval run) is no reason to wait long for a connection.
    waits = httpx.Timeout(timeout, connect=min(timeout, 60))
    try:
        resp = httpx.request(
            method,
            front + path,
            headers={"Authorization": f"Bearer {key}"},
            timeout=waits,
            **kwargs,
        )
    except httpx.ReadTimeout as exc:
        raise click.ClickException(
            f"the server at {front} did not answer in {timeout:g} s"
        ) from exc
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the server at {front}: {exc}") from exc
    if resp.status_code >= 400:
        raise click.ClickException(f"{resp.status_code}: {_reason(resp.text)}")
    return resp.json()


def _reason(text: str) -> str:
    """The message of the server's error body (`{"error": {"message"}}`), else the body."""
    try:
        body = json.loads(text)
    except ValueError:
        return text
    if not isinstance(body, dict):
        return text
    error = body.get("error")
    if isinstance(error, dict) and isinstance(message := error.get("message"), str):
        return message
    return str(body.get("detail") or text)
