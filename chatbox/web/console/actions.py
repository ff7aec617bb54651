"""The admin console's helpers and actions (htmx posts with the session's CSRF token) on
people, keys and models. Each answers with the page it changed, and lands in the audit log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Controller, Response, post
from litestar.exceptions import ClientException, NotFoundException, PermissionDeniedException

from chatbox.accounts import User
from chatbox.accounts.audit import entry_out
from chatbox.accounts.people import NotForAdmins, People, PeopleError
from chatbox.chat.rollout.model_admin import ModelAdmin, ModelAdminError
from chatbox.services.server import Services
from chatbox.web.auth import AnyRequest
from chatbox.web.deps import ServicesDep, UserDep
from chatbox.web.ui.helpers import FORM, UI_EXCEPTION_HANDLERS, html
from chatbox.web.urls import reverse


@dataclass
class NewUserForm:
    name: str = ""
    role: str = "member"
    tier: str = "free"
    password: str = ""


@dataclass
class ValueForm:
    value: str = ""


@dataclass
class NewModelForm:
    path: str = ""
    name: str = ""
    copy: str = ""  # a checkbox: "on" when ticked


def refused(exc: Exception) -> Exception:
    """A change that cannot be made: 404 for a missing thing, 403 for one admins may not
    make, else 400 saying why."""
    if isinstance(exc, LookupError):
        return NotFoundException(str(exc).strip("'\""))
    if isinstance(exc, NotForAdmins):
        return PermissionDeniedException(str(exc))
    return ClientException(str(exc))


AUDIT_PAGE = 100


def require_admin(user: User) -> None:
    if user.role != "admin":
        raise PermissionDeniedException("only admins can open the console")


def model_admin(services: Services) -> ModelAdmin:
    if services.model_admin is None:
        raise NotFoundException("models are not managed in this process")
    return services.model_admin


def tiers(services: Services) -> list[str]:
    """The policy's tiers (what the People page offers)."""
    return sorted(services.chat.gate.policy.tiers)


def page(request: AnyRequest, template: str, section: str, /, **context: Any) -> Response[str]:
    return html(request, template, section=section, **context)


async def person_page(
    request: AnyRequest,
    services: Services,
    user: User,
    user_id: str,
    status: int = 200,
    headers: dict[str, str] | None = None,
    /,
    **extra: Any,
) -> Response[str]:
    """The person page (also what each action on it answers with, with a notice)."""
    people = People(services.accounts, user)
    try:
        person = await people.person(user_id)
    except LookupError as exc:
        raise NotFoundException("no such user") from exc
    entries = await services.accounts.audit_log(20, target=person.user)
    return html(
        request,
        "console_person.html",
        status,
        headers,
        section="people",
        person=person,
        tiers=tiers(services),
        audit=[entry_out(e) for e in entries],
        me=user,
        **extra,
    )


class ConsoleActions(Controller):
    path = "/console"
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    # -- people ----------------------------------------------------------------------------

    @post("/people", status_code=200)
    async def add_user(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        data: Annotated[NewUserForm, FORM],
    ) -> Response[str]:
        require_admin(user)
        people = People(services.accounts, user)
        if data.tier not in tiers(services):
            raise ClientException(f"tier must be one of {', '.join(tiers(services))}")
        try:
            added = await people.add(data.name, data.role, data.tier, data.password)
        except PeopleError as exc:
            raise refused(exc) from exc
        # The page now shows the person: the address bar says so (a reload or a link keeps it).
        push = {"HX-Push-Url": reverse(request, "console_person", user_id=added.id)}
        return await person_page(
            request, services, user, added.id, 200, push, notice=f"Added {added.name}."
        )

    @post("/people/{user_id:str}/{action:str}", status_code=200, name="console_person_action")
    async def change_user(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        user_id: str,
        action: str,
        data: Annotated[ValueForm, FORM],
    ) -> Response[str]:
        """tier, role, disable, enable, password (blank: generated) or keys (a new key)."""
        require_admin(user)
        people = People(services.accounts, user)
        extra: dict[str, str] = {}
        try:
            if action == "tier":
                if data.value not in tiers(services):
                    raise PeopleError(f"tier must be one of {', '.join(tiers(services))}")
                changed = await people.set_tier(user_id, data.value)
                extra["notice"] = f"{changed.name} is now on the {data.value} tier."
            elif action == "role":
                changed = await people.set_role(user_id, data.value)
                extra["notice"] = f"{changed.name} is now {data.value}."
            elif action in ("disable", "enable"):
                changed = await people.set_disabled(user_id, action == "disable")
                extra["notice"] = f"{changed.name} is {action}d."
            elif action == "password":
                changed, password = await people.reset_password(user_id, data.value or None)
                extra["notice"] = f"The password of {changed.name} was reset."
                if not data.value:
                    extra["secret"] = password
                    extra["secret_label"] = "The new password (shown once)"
            elif action == "keys":
                key, secret = await people.create_key(user_id, data.value)
                extra["notice"] = f"Created the key {key.prefix}…"
                extra["secret"] = secret
                extra["secret_label"] = "The new API key (shown once; copy it now)"
            else:
                raise NotFoundException("no such action")
        except (PeopleError, LookupError) as exc:
            raise refused(exc) from exc
        return await person_page(request, services, user, user_id, **extra)

    @post(
        "/people/{user_id:str}/revoke-key/{key_id:str}", status_code=200, name="console_revoke_key"
    )
    async def revoke_key(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, user_id: str, key_id: str
    ) -> Response[str]:
        require_admin(user)
        try:
            key = await People(services.accounts, user).revoke_key(user_id, key_id)
        except LookupError as exc:
            raise refused(exc) from exc
        return await person_page(
            request, services, user, user_id, notice=f"Revoked the key {key.prefix}…"
        )

    # -- models ----------------------------------------------------------------------------

    async def _models_page(
        self, request: AnyRequest, services: ServicesDep, notice: str
    ) -> Response[str]:
        admin = model_admin(services)
        return html(
            request,
            "console_models.html",
            section="models",
            models=await admin.models(),
            tier_defaults=admin.tier_defaults(),
            memory=await services.memory(),
            feedback=await services.chat.feedback_tallies(),
            notice=notice,
        )

    @post("/models", status_code=200)
    async def add_model(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        data: Annotated[NewModelForm, FORM],
    ) -> Response[str]:
        require_admin(user)
        try:
            name = await model_admin(services).add(
                user, data.path, data.name or None, copy=data.copy == "on"
            )
        except ModelAdminError as exc:
            raise refused(exc) from exc
        return await self._models_page(request, services, f"Added the model {name}.")

    @post("/models/{model:str}/{action:str}", status_code=200, name="console_model_action")
    async def change_model(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, model: str, action: str
    ) -> Response[str]:
        """load, unload or default (the parameter is not `name`, which reversal takes itself)."""
        require_admin(user)
        admin = model_admin(services)
        try:
            if action == "load":
                await admin.load(user, model)
                notice = f"Loaded {model}."
            elif action == "unload":
                await admin.unload(user, model)
                notice = f"Unloaded {model}."
            elif action == "default":
                await admin.set_default(user, model)
                notice = f"{model} is now the default model."
            else:
                raise NotFoundException("no such action")
        except (ModelAdminError, LookupError) as exc:
            raise refused(exc) from exc
        return await self._models_page(request, services, notice)
