"""Taking a turn: admission, prompt assembly, model choice, and persisting the answer."""

from chatbox.chat.errors import (
    Busy,
    ChatError,
    InvalidInput,
    NotFound,
    Overloaded,
    RateLimited,
    TooLong,
    UnknownModel,
)
from chatbox.chat.options import TurnOptions
from chatbox.chat.runs import RunEvent, TurnRun
from chatbox.chat.service import ChatService
from chatbox.chat.views import ConversationView, TurnView

__all__ = [
    "Busy", "ChatError", "ChatService", "ConversationView", "InvalidInput", "NotFound",
    "Overloaded", "RateLimited", "RunEvent", "TooLong", "TurnOptions", "TurnRun", "TurnView",
    "UnknownModel",
]
