"""Names for the injected dependencies (wired in `chatbox.app.create_app`).

Annotate handler parameters with these so Litestar knows they are dependencies, not
query parameters.
"""

from __future__ import annotations

from typing import TypeAlias

from litestar.di import NamedDependency
from prometheus_client import CollectorRegistry

from chatbox.accounts import AccountsService, User
from chatbox.chat import ChatService
from chatbox.data import DataService
from chatbox.knowledge import Knowledge
from chatbox.services.server import Services
from chatbox.settings import Settings

UserDep: TypeAlias = NamedDependency[User]
ChatDep: TypeAlias = NamedDependency[ChatService]
KnowledgeDep: TypeAlias = NamedDependency[Knowledge]
AccountsDep: TypeAlias = NamedDependency[AccountsService]
SettingsDep: TypeAlias = NamedDependency[Settings]
ServicesDep: TypeAlias = NamedDependency[Services]
MetricsDep: TypeAlias = NamedDependency[CollectorRegistry]
DataServiceDep: TypeAlias = NamedDependency[DataService]
