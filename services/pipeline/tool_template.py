"""mmgate's tool-aware ChatML template, for ChatML models whose own template ignores tools.

The tools go into the system turn as JSON inside <tools></tools>; the model is asked to call as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the Hermes format: vLLM's
``hermes`` tool parser reads it); an assistant turn's calls are written back the same way; tool
results travel in a user turn as <tool_response> blocks, consecutive results in one turn. The
format is NousResearch's Hermes 2 Pro's, as Qwen2.5's template renders it; the default system
text is SmolLM2-Instruct's own.
"""

from __future__ import annotations

import json
from typing import Final

DEFAULT_SYSTEM: Final = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TOOLS_INSTRUCTIONS: Final = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
CALL_FORMAT: Final = (
    "\n</tools>\n\nFor each function call, return a json object with function name and"
    " arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

HERMES_TOOLS_TEMPLATE: Final = (
    # every character written is a string literal: chat templates render with trim_blocks
    "{%- if messages[0].role == 'system' -%}"
    "{%- set system = messages[0].content -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system = default_system -%}{%- set turns = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- tools_instructions -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- call_format -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in turns -%}"
    "{%- if message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' -}}'
    "{{- (call.function.arguments | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def template_variables() -> dict[str, str]:
    """What the template reads besides the messages and tools."""
    return {
        "default_system": DEFAULT_SYSTEM,
        "tools_instructions": TOOLS_INSTRUCTIONS,
        "call_format": CALL_FORMAT,
    }


def standalone_template() -> str:
    """The template with its variables written in: what another server (``vllm serve
    --chat-template``) renders the same prompts with."""
    settings = "".join(
        f"{{%- set {name} = {json.dumps(value)} -%}}"
        for name, value in template_variables().items()
    )
    return settings + HERMES_TOOLS_TEMPLATE


__all__ = ["HERMES_TOOLS_TEMPLATE", "standalone_template", "template_variables"]
