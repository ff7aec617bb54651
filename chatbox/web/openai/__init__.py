"""The OpenAI-compatible API: reading a chat completion request and writing its answer."""
