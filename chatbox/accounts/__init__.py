"""Accounts: users, roles, sessions, API keys, and the counters that slow down guessing."""

from chatbox.accounts.audit import Actor, AuditLog, UserAdmin, cli_actor
from chatbox.accounts.service import AccountDisabled, AccountsService, ensure_admin
from chatbox.accounts.throttle import Attempts, LoginThrottle, TooManyAttempts
from chatbox.store import Session, User

__all__ = [
    "AccountDisabled",
    "AccountsService",
    "Actor",
    "Attempts",
    "AuditLog",
    "LoginThrottle",
    "Session",
    "TooManyAttempts",
    "User",
    "UserAdmin",
    "cli_actor",
    "ensure_admin",
]
