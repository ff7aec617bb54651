"""Accounts: users, roles, sessions, API keys, and the counters that slow down guessing."""

from chatbox.accounts.service import AccountsService, ensure_admin
from chatbox.accounts.throttle import Attempts, LoginThrottle, TooManyAttempts
from chatbox.store import Session, User

__all__ = [
    "AccountsService", "Attempts", "LoginThrottle", "Session", "TooManyAttempts", "User",
    "ensure_admin",
]
