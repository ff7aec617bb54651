"""LlamaIndex's `OpenAILike` with its default settings (a completion model, not chat),
run in its own environment (.venv-clients): prints what it got back as JSON.

Usage: python llamaindex_complete.py BASE_URL API_KEY MODEL PROMPT
"""

import json
import sys

from llama_index.llms.openai_like import OpenAILike

base_url, api_key, model, prompt = sys.argv[1:5]
llm = OpenAILike(model=model, api_base=base_url, api_key=api_key)
reply = llm.complete(prompt)
streamed = "".join(part.delta or "" for part in llm.stream_complete(prompt))
raw = reply.raw if isinstance(reply.raw, dict) else reply.raw.model_dump()
print(json.dumps({"text": reply.text, "object": raw.get("object"), "streamed": streamed}))
