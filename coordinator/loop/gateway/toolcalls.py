"""Tool calls in completions, in the Hermes / Qwen2.5 format: the model writes each call as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; the gateway returns them as OpenAI
`tool_calls` and the rest of the text as the message's content.

A call whose body is not a JSON object with a string `name` and object (or JSON-string)
`arguments`, or one that is opened and never closed, is malformed: the whole completion is then
returned as plain text (no tool calls) and the caller counts it. Tool schemas sent with a
request are checked to be valid JSON schema (`check_tools`), with an error that names the tool.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The arguments as a JSON object's text (what OpenAI's `function.arguments` holds)."""


@dataclass(frozen=True)
class ParsedCompletion:
    content: str
    """The text outside the calls (stripped), or the whole text when a call is malformed."""
    tool_calls: tuple[ToolCall, ...]
    malformed: int
    """Calls that could not be parsed (then tool_calls is empty and content the whole text)."""


def parse_tool_calls(text: str) -> ParsedCompletion:
    """Split `text` into content and tool calls (see the module docstring)."""
    if OPEN not in text:
        return ParsedCompletion(text, (), 0)
    calls: list[ToolCall] = []
    malformed = 0
    for body in _CALL.findall(text):
        call = _one_call(body)
        if call is None:
            malformed += 1
        else:
            calls.append(call)
    unclosed = text.count(OPEN) - len(_CALL.findall(text))
    malformed += max(unclosed, 0)
    if malformed:
        return ParsedCompletion(text, (), malformed)
    return ParsedCompletion(_CALL.sub("", text).strip(), tuple(calls), 0)


def _one_call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments))


class ToolSchemaError(ValueError):
    """A request's `tools` entry is not a function with a valid JSON schema."""


def check_tools(tools: list[dict] | None) -> None:
    """Raise ToolSchemaError naming the first tool that is not {"type": "function", "function":
    {"name": str, "parameters": <a valid JSON schema>}}."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    for index, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise ToolSchemaError(f"tools[{index}] must be {{'type': 'function', 'function': {{...}}}}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise ToolSchemaError(f"tools[{index}].function.name must be a non-empty string")
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise ToolSchemaError(f"tools[{index}] ({function['name']}): parameters must be a JSON schema object")
        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            raise ToolSchemaError(f"tools[{index}] ({function['name']}): parameters is not a valid JSON schema: "
                                  f"{exc.message}") from None
