"""The web layer: HTML pages, the conversation API, the OpenAI-compatible API, the console,
health (the route table: `chatbox.web.routes`)."""
