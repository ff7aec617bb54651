"""An agent framework with its default settings on /v1/responses, run in its own environment
(.venv-agents): prints what the run ended with as JSON.

Usage: python agents_run.py openai-agents|pydantic-ai|pydantic-ai-tools BASE_URL API_KEY MODEL
"""

import json
import sys
from typing import Literal

framework, base_url, api_key, model = sys.argv[1:5]
calls: list[str] = []


def get_weather(city: Literal["Oslo", "Rome"]) -> str:
    """The weather in a city now."""
    calls.append(city)
    return f"Sunny in {city}."


if framework == "openai-agents":
    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_client,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_default_openai_client(AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0))
    set_tracing_disabled(True)  # its traces go to OpenAI's own servers
    agent = Agent(
        name="weather",
        instructions="Answer with the weather, using the tool.",
        model=model,
        tools=[function_tool(get_weather)],
        # The tiny model rarely ends a text answer on its own: the tool's output is the
        # final output.
        tool_use_behavior="stop_on_first_tool",
        model_settings=ModelSettings(tool_choice="required", max_tokens=200),
    )
    result = Runner.run_sync(agent, "What is the weather in Oslo?")
    kinds = [item.type for item in result.new_items]
    print(json.dumps({"output": result.final_output, "items": kinds, "calls": calls}))
else:
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=base_url, api_key=api_key)
    responses = OpenAIResponsesModel(model, provider=provider)
    if framework == "pydantic-ai":
        text = Agent(responses).run_sync("Say hello.", model_settings={"max_tokens": 8})
        print(json.dumps({"output": text.output}))
    else:

        class Forecast(BaseModel):
            city: Literal["Oslo", "Rome"]
            sky: Literal["sunny", "rainy"]

        # A structured output allows no text: pydantic-ai offers its output tool
        # (final_result) with tool_choice required, and reads the call's arguments.
        agent = Agent(responses, output_type=Forecast)
        run = agent.run_sync("What is the weather in Oslo?", model_settings={"max_tokens": 200})
        out = {"output": run.output.model_dump(), "calls": calls, "requests": run.usage().requests}
        print(json.dumps(out))
