"""Who a person is at an identity provider or an auth proxy, and sign-ins under way.

An identity is (issuer, subject): the provider's URL (or "proxy" for an auth proxy's
headers) and its stable id for the person; it names one chatbox account for good. A sign-in
under way is kept by the hash of its `state` until its callback takes it, once, or it expires.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from chatbox.store.db import Database
from chatbox.store.keys import hash_token
from chatbox.store.records import User


@dataclass(frozen=True)
class Identity:
    issuer: str
    subject: str
    user: User
    email: str | None
    full_name: str | None
    groups: tuple[str, ...]  # as last seen at a sign-in
    csrf_token: str  # the proxy mode's CSRF token (it has no session of chatbox's own)
    provider_disabled: bool  # disabled by a sign-in that no rule allowed, not by an admin
    last_sign_in_at: float


@dataclass(frozen=True)
class SignInStart:
    """A sign-in sent to the provider: what its callback needs to finish it."""

    browser_hash: str
    nonce: str
    code_verifier: str
    redirect_uri: str
    next: str
    expires_at: float


class IdentityRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def find(self, issuer: str, subject: str) -> Identity | None:
        row = await self.db.fetchone(
            "SELECT u.*, i.issuer AS i_issuer, i.subject AS i_subject, i.email AS i_email,"
            " i.full_name AS i_full_name, i.group_names AS i_groups, i.csrf_token AS i_csrf,"
            " i.provider_disabled AS i_provider_disabled, i.last_sign_in_at AS i_last"
            " FROM identities i JOIN users u ON u.id = i.user_id"
            " WHERE i.issuer = ? AND i.subject = ?",
            (issuer, subject),
        )
        if row is None:
            return None
        return Identity(
            row["i_issuer"],
            row["i_subject"],
            User.from_row(row),
            row["i_email"],
            row["i_full_name"],
            tuple(json.loads(row["i_groups"])),
            row["i_csrf"],
            bool(row["i_provider_disabled"]),
            float(row["i_last"]),
        )

    async def save(
        self,
        issuer: str,
        subject: str,
        user_id: str,
        *,
        email: str | None,
        full_name: str | None,
        groups: tuple[str, ...],
        csrf_token: str,
        provider_disabled: bool,
    ) -> None:
        """Link (issuer, subject) to `user_id`, or update what the last sign-in said."""
        now = time.time()
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO identities (issuer, subject, user_id, email, full_name, group_names,"
                " csrf_token, provider_disabled, created_at, last_sign_in_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (issuer, subject) DO UPDATE SET email = excluded.email,"
                " full_name = excluded.full_name, group_names = excluded.group_names,"
                " csrf_token = excluded.csrf_token,"
                " provider_disabled = excluded.provider_disabled,"
                " last_sign_in_at = excluded.last_sign_in_at",
                (
                    issuer,
                    subject,
                    user_id,
                    email,
                    full_name,
                    json.dumps(list(groups)),
                    csrf_token,
                    int(provider_disabled),
                    now,
                    now,
                ),
            )

    async def issuers_by_user(self) -> dict[str, str]:
        """Each linked account's issuer (the newest link's, where it has several)."""
        rows = await self.db.fetchall(
            "SELECT user_id, issuer FROM identities ORDER BY last_sign_in_at"
        )
        return {r["user_id"]: r["issuer"] for r in rows}

    # -- sign-ins under way ------------------------------------------------------------------

    async def start(self, state: str, start: SignInStart) -> None:
        """Keep a sign-in sent to the provider (and drop those that expired unused)."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM sign_in_starts WHERE expires_at < ?", (time.time(),))
            await tx.execute(
                "INSERT INTO sign_in_starts (state_hash, browser_hash, nonce, code_verifier,"
                " redirect_uri, next, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    hash_token(state),
                    start.browser_hash,
                    start.nonce,
                    start.code_verifier,
                    start.redirect_uri,
                    start.next,
                    start.expires_at,
                ),
            )

    async def take(self, state: str) -> SignInStart | None:
        """The unexpired sign-in of this `state`, removed as it is read: a state works once."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM sign_in_starts WHERE state_hash = ?"
                " RETURNING browser_hash, nonce, code_verifier, redirect_uri, next, expires_at",
                (hash_token(state),),
            )
            row = await cur.fetchone()
        if row is None or float(row[5]) < time.time():
            return None
        return SignInStart(row[0], row[1], row[2], row[3], row[4], float(row[5]))
