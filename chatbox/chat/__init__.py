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
from chatbox.chat.running.runs import RunEvent, TurnRun
from chatbox.chat.service import ACTIVE_BRANCH, ChatService
from chatbox.chat.views import ConversationView, TurnView
from chatbox.engine.types import ChatMessage, DoneEvent, Generation, TokenEvent, Usage
from chatbox.store import Conversation, Feedback, FeedbackTally, Summary, Turn

__all__ = [
    "ACTIVE_BRANCH",
    "Busy",
    "ChatError",
    "ChatMessage",
    "ChatService",
    "Conversation",
    "ConversationView",
    "DoneEvent",
    "Feedback",
    "FeedbackTally",
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
