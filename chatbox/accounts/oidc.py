"""OpenID Connect, the protocol: discovery, the authorization code flow with PKCE (S256),
`state` and `nonce`, and the ID token checked against the issuer's published keys.

Nothing here is logged but what went wrong, in words: never a code, a token or the secret.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import httpx

from chatbox.settings import Settings

# authlib and joserfc load on a provider's first use: a box without one, and every CLI run,
# skips their import (a fifth of a second of CPU here).
if TYPE_CHECKING:
    from authlib.oidc.discovery import OpenIDProviderMetadata
    from joserfc.jwk import KeySet

METADATA_TTL_S = 3600.0  # discovery and keys are fetched again after this (keys rotate)
JWKS_REFETCH_S = 60.0  # an unknown key id refetches the keys at most this often
ASYMMETRIC = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


class ProviderUnreachable(Exception):
    """The identity provider did not answer as a provider does (down, slow, not OIDC)."""


class SignInFailed(Exception):
    """The provider's answer cannot be trusted or was a refusal; the message says why."""


@dataclass(frozen=True)
class Claims:
    """What a verified ID token (and the configured groups claim) says of the person."""

    issuer: str
    subject: str
    email: str | None
    email_verified: bool
    name: str | None
    username: str | None
    groups: tuple[str, ...]
    expires_at: float


@dataclass(frozen=True)
class Authorization:
    """Where to send the browser, and the secrets its callback is checked against."""

    url: str
    state: str
    nonce: str
    code_verifier: str


class OidcClient:
    """One relying party at one issuer; discovery and keys cached for an hour."""

    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None):
        assert settings.oidc_issuer and settings.oidc_client_id
        self.issuer = settings.oidc_issuer
        self.client_id = settings.oidc_client_id
        self.client_secret = settings.oidc_client_secret
        self.scopes = settings.oidc_scopes
        self.groups_claim = settings.oidc_groups_claim
        self.skew_s = settings.oidc_clock_skew_s
        self.timeout_s = settings.oidc_timeout_s
        self.transport = transport
        self._metadata: tuple[float, OpenIDProviderMetadata] | None = None
        self._keys: tuple[float, KeySet] | None = None
        self._lock = asyncio.Lock()

    # -- talking to the provider -------------------------------------------------------------

    async def _get_json(self, url: str) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as http:
                response = await http.get(url, headers={"Accept": "application/json"})
        except httpx.HTTPError as exc:
            raise ProviderUnreachable(f"{url}: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise ProviderUnreachable(f"{url} answered {response.status_code}")
        try:
            body = response.json()
        except ValueError as exc:
            raise ProviderUnreachable(f"{url} did not answer JSON") from exc
        if not isinstance(body, dict):
            raise ProviderUnreachable(f"{url} did not answer a JSON object")
        return body

    async def metadata(self) -> OpenIDProviderMetadata:
        """The issuer's discovery document, checked: its issuer is exactly ours, and it
        offers the code flow with PKCE S256 where it says which methods it offers."""
        now = time.monotonic()
        if self._metadata and now - self._metadata[0] < METADATA_TTL_S:
            return self._metadata[1]
        from authlib.oidc.discovery import OpenIDProviderMetadata, get_well_known_url

        body = await self._get_json(get_well_known_url(self.issuer, external=True))
        meta = OpenIDProviderMetadata(body)
        if meta.get("issuer") != self.issuer:
            raise ProviderUnreachable(
                f"the discovery document names the issuer {meta.get('issuer')!r}, "
                f"not the configured {self.issuer!r}"
            )
        for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(meta.get(key), str):
                raise ProviderUnreachable(f"the discovery document has no {key}")
        methods = meta.get("code_challenge_methods_supported")
        if methods is not None and "S256" not in methods:
            raise ProviderUnreachable("the provider does not offer PKCE with S256")
        self._metadata = (now, meta)
        return meta

    async def _key_set(self, refresh: bool = False) -> KeySet:
        now = time.monotonic()
        cached = self._keys
        fresh_enough = refresh and cached is not None and now - cached[0] < JWKS_REFETCH_S
        if cached and (fresh_enough or (not refresh and now - cached[0] < METADATA_TTL_S)):
            return cached[1]
        meta = await self.metadata()
        body = await self._get_json(str(meta["jwks_uri"]))
        from joserfc.errors import JoseError
        from joserfc.jwk import KeySet

        try:
            keys = KeySet.import_key_set(body)  # type: ignore[arg-type]
        except (JoseError, ValueError, KeyError, TypeError) as exc:
            raise ProviderUnreachable("the provider's key set could not be read") from exc
        self._keys = (now, keys)
        return keys

    # -- the flow ----------------------------------------------------------------------------

    async def authorize(self, redirect_uri: str) -> Authorization:
        """The provider's authorization URL for a new sign-in, with fresh secrets."""
        from authlib.common.security import generate_token
        from authlib.oauth2.rfc7636 import create_s256_code_challenge

        meta = await self.metadata()
        state, nonce, verifier = generate_token(43), generate_token(43), generate_token(64)
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.client_id,
                "redirect_uri": redirect_uri,
                "scope": " ".join(self.scopes),
                "state": state,
                "nonce": nonce,
                "code_challenge": create_s256_code_challenge(verifier),
                "code_challenge_method": "S256",
            }
        )
        endpoint = str(meta["authorization_endpoint"])
        url = endpoint + ("&" if "?" in endpoint else "?") + query
        return Authorization(url, state, nonce, verifier)

    async def finish(self, code: str, code_verifier: str, nonce: str, redirect_uri: str) -> Claims:
        """Exchange the code at the token endpoint and verify the ID token it returns."""
        meta = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": code_verifier,
            "client_id": self.client_id,
        }
        methods = meta.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        basic = self.client_secret is not None and "client_secret_basic" in methods
        if self.client_secret is not None and not basic:
            form["client_secret"] = self.client_secret
        # RFC 6749 2.3.1: the id and secret are form-encoded before they are joined
        auth = (
            httpx.BasicAuth(
                quote(self.client_id, safe=""), quote(self.client_secret or "", safe="")
            )
            if basic
            else httpx.USE_CLIENT_DEFAULT
        )
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as http:
                response = await http.post(
                    str(meta["token_endpoint"]),
                    data=form,
                    auth=auth,
                    headers={"Accept": "application/json"},
                )
        except httpx.HTTPError as exc:
            raise ProviderUnreachable(f"the token endpoint: {type(exc).__name__}") from exc
        if response.status_code >= 500:
            raise ProviderUnreachable(f"the token endpoint answered {response.status_code}")
        try:
            body = response.json()
        except ValueError as exc:
            raise ProviderUnreachable("the token endpoint did not answer JSON") from exc
        if response.status_code != 200 or not isinstance(body, dict):
            error = body.get("error") if isinstance(body, dict) else None
            raise SignInFailed(f"the provider refused the code ({error or response.status_code})")
        id_token = body.get("id_token")
        if not isinstance(id_token, str):
            raise SignInFailed("the provider's answer holds no ID token")
        return await self.verify(id_token, nonce, meta)

    async def verify(
        self, id_token: str, nonce: str, meta: OpenIDProviderMetadata | None = None
    ) -> Claims:
        """The ID token's claims once its signature (by one of the issuer's keys, with an
        asymmetric algorithm it offers), issuer, audience, times and nonce all check out."""
        from joserfc import jwt
        from joserfc.errors import InvalidKeyIdError, JoseError

        meta = meta or await self.metadata()
        offered = meta.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = [a for a in offered if a in ASYMMETRIC]
        try:
            token = jwt.decode(id_token, await self._key_set(), algorithms=algorithms)
        except InvalidKeyIdError:
            try:  # the provider may have rotated its keys since they were fetched
                token = jwt.decode(id_token, await self._key_set(True), algorithms=algorithms)
            except JoseError as exc:
                raise SignInFailed(f"the ID token's signature is not valid ({exc.error})") from exc
        except JoseError as exc:
            raise SignInFailed(f"the ID token's signature is not valid ({exc.error})") from exc
        return self._check_claims(token.claims, nonce)

    def _check_claims(self, claims: dict[str, Any], nonce: str) -> Claims:
        now = time.time()
        if claims.get("iss") != self.issuer:
            raise SignInFailed("the ID token is from another issuer")
        aud = claims.get("aud")
        audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if self.client_id not in audiences:
            raise SignInFailed("the ID token is meant for another client")
        if len(audiences) > 1 and claims.get("azp", self.client_id) != self.client_id:
            raise SignInFailed("the ID token was issued to another client (azp)")
        exp, iat = claims.get("exp"), claims.get("iat")
        if not isinstance(exp, int | float) or not isinstance(iat, int | float):
            raise SignInFailed("the ID token has no exp or iat")
        if exp <= now - self.skew_s:
            raise SignInFailed("the ID token has expired")
        if iat > now + self.skew_s:
            raise SignInFailed("the ID token was issued in the future (check the clocks)")
        nbf = claims.get("nbf")
        if isinstance(nbf, int | float) and nbf > now + self.skew_s:
            raise SignInFailed("the ID token is not valid yet (check the clocks)")
        if not isinstance(claims.get("nonce"), str) or claims["nonce"] != nonce:
            raise SignInFailed("the ID token's nonce is not this sign-in's")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise SignInFailed("the ID token names no subject")
        email = claims.get("email")
        name = claims.get("name")
        username = claims.get("preferred_username")
        return Claims(
            self.issuer,
            subject,
            email if isinstance(email, str) and email else None,
            claims.get("email_verified") is True,
            name if isinstance(name, str) and name else None,
            username if isinstance(username, str) and username else None,
            groups_of(claims, self.groups_claim),
            float(exp),
        )


def groups_of(claims: dict[str, Any], claim: str) -> tuple[str, ...]:
    """The groups a claim names: a list of names, or one string of them (comma- or
    space-separated); a dotted name reaches into objects (Keycloak's realm_access.roles)."""
    value: Any = claims
    for part in claim.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        return tuple(g for g in value.replace(",", " ").split() if g)
    if isinstance(value, list):
        return tuple(str(g) for g in value if isinstance(g, str | int) and str(g))
    return ()
