"""Stateless answers (the OpenAI-compatible API): completions, the Responses API's
translation, grammars for tools and response formats, and metering."""
