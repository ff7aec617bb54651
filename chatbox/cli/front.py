"""The CLI's calls to a running server's admin API (`chatbox replicas`, `chatbox doctor`)."""

from __future__ import annotations

from typing import Any

import click


def admin_call(front: str, key: str | None, method: str, path: str, **kwargs: Any) -> Any:
    """`method path` on the server at `front` with an admin's key; its JSON, or a
    ClickException naming the status and the server's reason."""
    import httpx  # only commands that talk to a server load it

    if not key:
        raise click.ClickException("an admin API key is needed: --key or CHATBOX_ADMIN_KEY")
    try:
        resp = httpx.request(
            method, front + path, headers={"Authorization": f"Bearer {key}"}, timeout=60, **kwargs
        )
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the server at {front}: {exc}") from exc
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail") or resp.text
        except ValueError:
            detail = resp.text
        raise click.ClickException(f"{resp.status_code}: {detail}")
    return resp.json()
