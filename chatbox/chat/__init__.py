"""Taking a turn: admission, prompt assembly, model choice, and persisting the answer."""

from chatbox.chat.errors import (
    Busy,
    ChatError,
    Forbidden,
    GenerationFailed,
    InvalidInput,
    NotFound,
    Overloaded,
    RateLimited,
    Refused,
    TooLong,
    UnknownModel,
)
from chatbox.chat.options import TurnOptions
from chatbox.chat.runs import RunEvent, TurnRun
from chatbox.chat.service import ACTIVE_BRANCH, ChatService
from chatbox.chat.views import ConversationView, TurnView
from chatbox.engine.types import ChatMessage, DoneEvent, Generation, TokenEvent, Usage
from chatbox.store import Conversation, Summary, Turn

__all__ = [
    "ACTIVE_BRANCH",
    "Busy",
    "ChatError",
    "ChatMessage",
    "ChatService",
    "Conversation",
    "ConversationView",
    "DoneEvent",
    "Forbidden",
    "Generation",
    "GenerationFailed",
    "InvalidInput",
    "NotFound",
    "Overloaded",
    "RateLimited",
    "Refused",
    "RunEvent",
    "Summary",
    "TokenEvent",
    "TooLong",
    "Turn",
    "TurnOptions",
    "TurnRun",
    "TurnView",
    "UnknownModel",
    "Usage",
]
