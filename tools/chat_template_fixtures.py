"""Chat template fixtures (issue 34): templates, conversations and what jinja2
renders for them, for libcaf_serving/text/chat_template.test.cpp.

Each case is rendered by transformers' own compiled environment
(transformers.utils.chat_template_utils._compile_jinja_template: jinja2 3.1.6's
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols,
the generation tag, and the globals raise_exception, strftime_now, namespace,
dict and its tojson filter), with the variables apply_chat_template passes
(messages, tools=None and documents=None unless given, add_generation_prompt,
the special tokens, extra keyword arguments).

The family templates under tests/text/fixtures/chat_templates/*.jinja are
written here in the formats the model families publish (ChatML/Qwen2,
Llama-3.1 with tools, Llama-2 and Mistral [INST], Gemma, Phi-3,
DeepSeek-style); they are not copies of any model's file.

Writes tests/text/fixtures/chat_templates/{cases.json, <family>.jinja}:
  {"cases": [{"name", "template_file" or "source", "context",
              "expected" | "error": {"type", "message", "raised", "lineno"}}]}
where raised marks raise_exception (its message must come back verbatim) and
lineno is the line jinja2 names for a syntax error.

Run: /work/venv/bin/python tools/chat_template_fixtures.py
"""
import json
import os

import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "text", "fixtures", "chat_templates")

# -- family templates ------------------------------------------------------------

FAMILIES = {}

FAMILIES["chatml_qwen2"] = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

FAMILIES["llama3"] = """{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"""

FAMILIES["llama31_tools"] = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block pulls the system message out of the list, to place it first. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools go into the first user message, with some guidance #}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

FAMILIES["llama2"] = """{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"""

FAMILIES["mistral_v3"] = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

FAMILIES["gemma"] = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"""

FAMILIES["gemma3_content_parts"] = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

FAMILIES["phi3"] = """{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"""

FAMILIES["deepseek_r1_style"] = """{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}{%- if message['content'] is none %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- set ns.is_first = true -%}{%- else %}{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- if message['role'] == 'assistant' and 'tool_calls' not in message %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"""

FAMILIES["qwen3_thinking"] = """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "system" %}
        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

# A macro-based template (as Command-R and Granite style templates use).
FAMILIES["macro_style"] = """{%- macro render_content(content) -%}
{%- if content is string -%}
{{ content | trim }}
{%- else -%}
{%- for part in content if part.type == 'text' -%}
{{ part.text }}{% if not loop.last %} {% endif %}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- macro turn(role, content, sep='\\n') -%}
<|{{ role }}|>{{ sep }}{{ render_content(content) }}<|end|>
{% endmacro -%}
{%- for m in messages -%}
{{ turn(m.role, m.content) }}
{%- endfor -%}
{%- if add_generation_prompt %}<|assistant|>
{% endif -%}
"""

# -- conversations ---------------------------------------------------------------

SYS = {"role": "system", "content": "You are a concise assistant."}
U1 = {"role": "user", "content": "Hello! What's 2+2?"}
A1 = {"role": "assistant", "content": "  2+2 is 4.  "}
U2 = {"role": "user", "content": "And in French? Réponds en français, s'il te plaît.\n"}
A2 = {"role": "assistant", "content": "<think>\nThe user wants French.\n</think>\n\nQuatre."}
U3 = {"role": "user", "content": "Merci 🙂 \"quoted\" and \\ backslash\ttab"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
        "return": {"type": "string"},
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Current time", "parameters": {"type": "object", "properties": {}}}}
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]}
CALL_TEXT = {"role": "assistant", "content": "Let me check.", "tool_calls": [{"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}, {"type": "function", "function": {"name": "get_time", "arguments": {}}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call12345", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"}
TOOL_RESULT2 = {"role": "tool", "tool_call_id": "call67890", "content": "12:00"}

# -- cases -------------------------------------------------------------------------

cases = []


def ctx(messages=(), add_generation_prompt=False, bos="<s>", eos="</s>", tools=None, **extra):
    c = {"messages": list(messages), "tools": tools, "documents": None,
         "add_generation_prompt": add_generation_prompt, "bos_token": bos, "eos_token": eos}
    c.update(extra)
    return c


def render(source, context):
    try:
        compiled = _compile_jinja_template(source)
    except jinja2.TemplateSyntaxError as e:
        return {"error": {"type": type(e).__name__, "message": e.message or "", "raised": False, "lineno": e.lineno}}
    except Exception as e:  # noqa: BLE001 - e.g. Python's SyntaxError for a break outside a loop
        return {"error": {"type": type(e).__name__, "message": str(e), "raised": False, "lineno": None}}
    try:
        return {"expected": compiled.render(**json.loads(json.dumps(context)))}
    except Exception as e:  # noqa: BLE001 - every failure is a case's expectation
        raised = type(e) is jinja2.exceptions.TemplateError
        return {"error": {"type": type(e).__name__, "message": str(e), "raised": raised, "lineno": None}}


def family(name, family_name, context):
    result = render(FAMILIES[family_name], context)
    cases.append({"name": name, "template_file": family_name + ".jinja", "context": context, **result})


def small(name, source, context=None):
    context = context if context is not None else ctx([U1, A1, U2])
    cases.append({"name": name, "source": source, "context": context, **render(source, context)})


# Families: plain chats, system prompts, generation prompts, tools, errors.
for fam in FAMILIES:
    family(fam + "/user", fam, ctx([U1], True))
    family(fam + "/chat", fam, ctx([U1, A1, U2], True))
    family(fam + "/chat_no_prompt", fam, ctx([U1, A1, U2, A2]))
    family(fam + "/system", fam, ctx([SYS, U1, A1, U3], True))
    family(fam + "/unicode", fam, ctx([U3, A2, U2], True, bos="", eos="<|endoftext|>"))
family("chatml_qwen2/tools", "chatml_qwen2", ctx([SYS, U1], True, tools=[WEATHER_TOOL, TIME_TOOL]))
family("chatml_qwen2/tool_calls", "chatml_qwen2", ctx([U1, CALL_TEXT, TOOL_RESULT, TOOL_RESULT2, A1], True, tools=[WEATHER_TOOL]))
family("llama31_tools/tools_in_user", "llama31_tools", ctx([SYS, U1, CALL, TOOL_RESULT], True, bos="<|begin_of_text|>", tools=[WEATHER_TOOL]))
family("llama31_tools/tools_in_system", "llama31_tools", ctx([U1], True, bos="<|begin_of_text|>", tools=[WEATHER_TOOL, TIME_TOOL], tools_in_user_message=False, date_string="01 Jan 2025"))
family("llama31_tools/builtin", "llama31_tools", ctx([U1, {"role": "assistant", "tool_calls": [{"function": {"name": "brave_search", "arguments": {"query": "weather", "lang": "en"}}}]}], False, builtin_tools=["brave_search", "code_interpreter", "wolfram_alpha"]))
family("llama31_tools/two_calls_error", "llama31_tools", ctx([U1, CALL_TEXT], tools=[WEATHER_TOOL]))
family("llama31_tools/no_user_error", "llama31_tools", ctx([SYS], tools=[WEATHER_TOOL]))
family("llama31_tools/tool_mapping", "llama31_tools", ctx([U1, CALL, {"role": "tool", "content": {"t": 1, "list": [1, 2.5, None, True]}}]))
family("llama2/alternation_error", "llama2", ctx([U1, U2]))
family("llama2/starts_with_assistant", "llama2", ctx([A1, U1]))
family("mistral_v3/tools", "mistral_v3", ctx([SYS, U1, A1, U2], tools=[WEATHER_TOOL, TIME_TOOL]))
family("mistral_v3/tool_calls", "mistral_v3", ctx([U1, CALL, TOOL_RESULT, A1, U2], tools=[WEATHER_TOOL]))
family("mistral_v3/bad_call_id", "mistral_v3", ctx([U1, {"role": "assistant", "tool_calls": [{"id": "short", "function": {"name": "f", "arguments": {}}}]}]))
family("mistral_v3/alternation_error", "mistral_v3", ctx([U1, U2]))
family("mistral_v3/unknown_role", "mistral_v3", ctx([U1, {"role": "narrator", "content": "x"}]))
family("gemma/alternation_error", "gemma", ctx([U1, A1, A1]))
family("gemma3_content_parts/parts", "gemma3_content_parts", ctx([{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe this. "}]}, A1], True))
family("gemma3_content_parts/bad_content", "gemma3_content_parts", ctx([{"role": "user", "content": 42}]))
family("deepseek_r1_style/tools", "deepseek_r1_style", ctx([SYS, SYS, U1, {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}, {"type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}, TOOL_RESULT, TOOL_RESULT2, A1, U2], True))
family("deepseek_r1_style/no_prompt_var", "deepseek_r1_style", {"messages": [U1], "bos_token": "<bos>", "tools": None, "documents": None})
family("qwen3_thinking/no_thinking", "qwen3_thinking", ctx([U1, A2, U2], True, enable_thinking=False))
family("qwen3_thinking/reasoning_field", "qwen3_thinking", ctx([U1, {"role": "assistant", "content": "Four.", "reasoning_content": "\nsimple\n"}], False))
family("qwen3_thinking/tool_response_user", "qwen3_thinking", ctx([U1, A2, {"role": "user", "content": "<tool_response>x</tool_response>"}, A2], True))
family("macro_style/parts", "macro_style", ctx([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}, A1], True))

# Whitespace control, trim_blocks and lstrip_blocks.
WS_CTX = ctx([U1, A1])
for i, src in enumerate([
    "a\n{% if true %}\nb\n{% endif %}\nc",
    "a\n  {% if true %}\n  b\n  {% endif %}\nc\n",
    "a\n  {%+ if true %}\n  b\n  {%+ endif %}\nc",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "a\n  {{ 'x' }}\n  {{- 'y' -}}\n  z",
    "  {# comment #}\nx\n  {#- c2 -#}  y\n{# c3 +#}\nz",
    "{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n",
    "{% for m in messages -%}\n  {{ m.role }}\n{%- endfor %}",
    "{% for m in messages %}  {{ m.role }}  {% endfor %}",
    "x {% if true %} y {% endif %} z",
    "\t\t{% if true %}tab{% endif %}\n",
    "line1\r\nline2\r\n{% if true %}\r\nline3\r\n{% endif %}\r\n",
    "a\n\n",
    "{% raw %}{{ not parsed }}{% endraw %}\n  {%- raw -%}  {% x %}  {%- endraw %} done",
    "  {% set x = 1 %}\n  {{ x }}\n",
    "{%- set x = 'a' -%}\n\n\n{{ x }}\n\n{{- x -}}\n\n",
    "{{ 'a' }}\n{{ 'b' }}\n",
    "{% if true %}a{% else %}b{% endif %}\n",
    "  {%+ if true %}x{% endif %}",
    "text{#-\nmultiline\ncomment\n-#}\n\nafter",
    "{% for i in range(3) %}{{ i }}{{ ', ' if not loop.last }}{% endfor %}",
    "{% if true %}   \n  x{% endif %}",
    "a {%- if true %}\n b{% endif %}",
    "{% macro m() %}\n  inside\n{% endmacro %}\n[{{ m() }}]",
]):
    small("whitespace/%02d" % i, src, WS_CTX)

# Expressions and literals.
for i, src in enumerate([
    "{{ 'single' }} {{ \"double\" }} {{ 'esc\\'aped\\n\\ttab \\\\ \\u00e9 \\x41' }} {{ 'adj' 'acent' }}",
    "{{ 1 }} {{ -2 }} {{ 3.5 }} {{ 1e3 }} {{ 2.5e-7 }} {{ 1e16 }} {{ 123456789012.0 }} {{ 0.1 + 0.2 }}",
    "{{ true }} {{ True }} {{ false }} {{ none }} {{ None }} {{ [1, 'a', none, true, 2.0] }} {{ {'k': 'v', 'n': [1]} }}",
    "{{ (1, 2) }} {{ (1,) }} {{ () }}",
    "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}",
    "{{ 1.5 + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ true + true }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2, 3] }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ undefined_var ~ 1.0 }}",
    "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ 2 >= 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }}",
    "{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'x' not in 'abc' }} {{ not 1 in [1] }} {{ 'a' in undefined_var }}",
    "{{ true and 'x' }} {{ 0 or 'y' }} {{ '' or [] }} {{ not '' }} {{ not not 3 }} {{ none and 1 }}",
    "{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'only' if false }}] {{ 1 if false else 2 if false else 3 }}",
    "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].role }} [{{ messages[5] }}] [{{ messages[0].missing }}] {{ messages.0.role }}",
    "{{ messages[1:] | length }} {{ messages[::-1][0].role }} {{ 'hello'[1:3] }} {{ 'hello'[-2:] }} {{ 'hello'[::2] }} {{ [1,2,3,4,5][1:-1] }} {{ [1,2,3][5:] }} {{ 'héllo'[1] }}",
    "{{ -(3) }} {{ +3 }} {{ -1.5 }} {{ 10 - -2 }} {{ -2 ** 2 }}",
    "{{ (1 + 2) * 3 }} {{ 1 + 2 * 3 }} {{ 2 * 3 ~ 4 }} {{ (1 + 2) ~ 3 }}",
    "{{ [1, 2, 3,] }} {{ {'a': 1,} }} {{ [] }} {{ {} }}",
    "{{ 'it\"s' }} {{ ['it\\'s', 'q\"', 'both\\'\"', 'nl\\n'] }}",
    "{{ 1.0 }} {{ 100.0 }} {{ 1e-4 }} {{ 1e-5 }} {{ 12345678901234567.0 }} {{ 3.0 * 1.1 }} {{ 1/3 }}",
]):
    small("expr/%02d" % i, src)

# Statements.
for i, src in enumerate([
    "{% if false %}a{% elif 0 %}b{% elif 'x' %}c{% else %}d{% endif %}",
    "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}",
    "{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ loop.nextitem.role if loop.nextitem else '-' }};{% endfor %}",
    "{% for m in [] %}x{% else %}empty{% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content[:5] }};{% else %}none{% endfor %}",
    "{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}{{ v }}{% endfor %}",
    "{% for (a, b) in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
    "{% for c in 'héy' %}[{{ c }}]{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ loop.last }}|{% endfor %}",
    "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = i + 10 %}{{ x }} {% endfor %}{{ x }}",
    "{% for i in range(3) %}{% set y = i %}{% endfor %}[{{ y }}]{% if true %}{% set z = 5 %}{% endif %}{{ z }}",
    "{% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.found }} {{ ns.n }}",
    "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}",
    "{% set block_var %}Hello {{ messages[0].role }}!{% endset %}[{{ block_var }}]{% set up | upper %}shout{% endset %}{{ up }}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', '?') }} {{ greet(punct='.', name='Cy') }} [{{ greet() }}]",
    "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ messages|length }}{% endcall %}",
    "{% macro row(x) %}{{ caller(x * 2) }}{% endmacro %}{% call(v) row(21) %}v={{ v }}{% endcall %}",
    "{% filter upper %}loud {{ 'text' }}{% endfilter %}",
    "{% generation %}gen {{ 1 }}{% endgeneration %}",
    "{% set messages = messages[1:] %}{{ messages | length }}{% for m in messages %}{{ m.role }}{% endfor %}",
    "{% set d = dict(a=1, b='x') %}{{ d }} {{ dict(d, c=3) }} {{ dict([['k', 2]]) }} {{ namespace(a=1).a }}",
    "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} {{ range(0) | list }}",
    "{% for i in range(3) %}{{ loop.cycle('odd', 'even') }} {% endfor %}",
    "{% set ns = namespace() %}{% set ns.items = [] %}{% for m in messages %}{% set ns.items = ns.items + [m.role] %}{% endfor %}{{ ns.items | join(',') }}",
]):
    small("stmt/%02d" % i, src)

# Tests.
for i, src in enumerate([
    "{{ x is defined }} {{ x is undefined }} {{ messages is defined }} {{ none is none }} {{ 0 is none }} {{ none is not none }}",
    "{{ 's' is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 's' is number }}",
    "{{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 's' is iterable }} {{ 1 is iterable }} {{ x is iterable }} {{ {} is iterable }}",
    "{{ [] is sequence }} {{ 's' is sequence }} {{ {} is sequence }} {{ 1 is sequence }}",
    "{{ true is boolean }} {{ 1 is boolean }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is integer }} {{ 1.0 is float }} {{ 1 is float }}",
    "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ none is false }}",
    "{{ 3 is odd }} {{ 3 is even }} {{ -2 is even }} {{ 9 is divisibleby 3 }} {{ 10 is divisibleby(3) }}",
    "{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 'a' is ne 'b' }} {{ 2 is gt 1 }} {{ 2 is lt 1 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 2 is in [1, 2] }}",
    "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '12' is upper }} {{ 'AB1' is upper }}",
    "{{ messages[0].content is string and messages[0].content is not none }} {{ not messages[0] is mapping }}",
    "{{ none is sameas none }} {{ false is sameas false }} {{ 1 is sameas true }}",
    "{% macro m() %}{% endmacro %}{{ m is callable }} {{ 1 is callable }} {{ range is callable }} {{ namespace() is callable }}",
]):
    small("test/%02d" % i, src)

# Filters.
for i, src in enumerate([
    "[{{ '  pad \\n' | trim }}] [{{ 'xxhixx' | trim('x') }}] [{{ undefined_var | trim }}] [{{ 42 | trim }}]",
    "{{ messages | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }} {{ undefined_var | length }}",
    "{{ 'Hello World' | upper }} {{ 'Hello World' | lower }} {{ 'hello WORLD' | capitalize }} {{ 'hello-world foo(bar) [x] <y>' | title }} {{ \"it's a test\" | title }}",
    "{{ undefined_var | default('dflt') }} {{ none | default('dflt') }} {{ '' | default('dflt', true) }} {{ 0 | d('zero', boolean=true) }} {{ 'v' | default('dflt') }} [{{ undefined_var | default }}]",
    "{{ messages | first }} {{ (messages | last).role }} {{ 'abc' | first }} {{ 'abc' | last }} [{{ [] | first }}]",
    "{{ [1, 2, 3] | join(', ') }} {{ messages | join('|', attribute='role') }} {{ ['a', 1, none] | join }} {{ 'abc' | join('-') }}",
    "{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'x' | replace('', '.') }}",
    "{{ 'abc' | list }} {{ {'k': 1, 'j': 2} | list }} {{ 3 | string }} {{ none | string }} {{ [1, 'a'] | string }} {{ 1.0 | string }}",
    "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ true | int }} {{ ' 12 ' | int }} {{ 'ff' | int(base=16) }} {{ '1_000' | int }}",
    "{{ '4.5' | float }} {{ 3 | float }} {{ 'x' | float }} {{ 'x' | float(1.5) }} {{ ' 1e3 ' | float }}",
    "{{ {'a': 1, 'b': [2]} | items | list }} {{ undefined_var | items | list }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}",
    "{{ messages | rejectattr('role', 'eq', 'user') | list | length }} {{ messages | selectattr('missing') | list }} {{ messages | selectattr('role', 'in', ['assistant']) | list | length }}",
    "{{ [1, 0, 2, none, ''] | select | list }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ [1, 5, 9] | select('gt', 4) | list }}",
    "{{ ['a', 'B'] | map('upper') | list }} {{ messages | map(attribute='nope', default='x') | list }} {{ [' a ', 'b '] | map('trim') | join }} {{ [[1, 2]] | map('join', '-') | list }}",
    "{{ ['b', 'A', 'a', 'B', 'c'] | unique | list }} {{ ['b', 'A', 'a'] | unique(case_sensitive=true) | list }} {{ messages | unique(attribute='role') | map(attribute='role') | list }}",
    "{{ [3, 1, 2] | reverse | list }} {{ 'abc' | reverse }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ [3, 1, 2] | sort(reverse=true) }}",
    "{{ messages | sort(attribute='role') | map(attribute='role') | join(',') }} {{ [{'n': 2}, {'n': 1}] | sort(attribute='n') }}",
    "{{ '<b>' | safe }} {{ 2.5 | round }} {{ 3.5 | round }} {{ -2.5 | round }} {{ 2.675 | round(2) }} {{ 3.14159 | round(3) }} {{ 7 | round }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }}",
    "{{ -3 | abs }} {{ -2.5 | abs }} {{ (3 - 5) | abs }}",
    "[{{ 'a\\nb\\n\\nc' | indent }}] [{{ 'a\\nb' | indent(2, true) }}] [{{ 'a\\n\\nb' | indent(2, blank=true) }}] [{{ 'x\\ny' | indent('> ') }}]",
    "{{ {'a': 1, 'b': [1, 2.5, none, true, 'é\"\\\\\\n\\t\\u0001'], 'c': {}} | tojson }}",
    "{{ {'a': 1, 'b': [1, {'c': []}], 'd': {}} | tojson(indent=2) }}",
    "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ [1, 2] | tojson(separators=(',', ':')) }} {{ 'x' | tojson }} {{ none | tojson }} {{ 1.0 | tojson }} {{ [1e20, 1e-7, 0.5] | tojson }}",
    "{{ messages | tojson(indent=4) }}",
    "{{ {'t': 'tab'} | tojson(indent='\\t') }}",
    "{{ [1, 2, 3] | sum }} {{ [1.5, 2] | sum }} {{ messages | map(attribute='content') | map('length') | sum }} {{ 'a b  c' | wordcount }}",
    "{{ 'x' | upper | lower | capitalize }} {{ (messages | map(attribute='role') | list)[1] }}",
]):
    small("filter/%02d" % i, src)

# String and dict methods.
for i, src in enumerate([
    "[{{ '  s  '.strip() }}] [{{ '  s  '.lstrip() }}] [{{ '  s  '.rstrip() }}] [{{ 'xxsxx'.strip('x') }}] [{{ '\\n\\nhi\\n'.strip('\\n') }}] [{{ 'abcba'.rstrip('ab') }}]",
    "{{ 'hello'.startswith('he') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('lo') }} {{ 'hello'.endswith('x') }}",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b \\n c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'x</think>y</think>z'.split('</think>')[-1] }} {{ ''.split() }} {{ ''.split(',') }}",
    "{{ 'MiXed'.lower() }} {{ 'MiXed'.upper() }} {{ \"hello world-foo o'neil 2nd\".title() }} {{ 'hELLO'.capitalize() }}",
    "{{ 'aXbXc'.replace('X', '-') }} {{ 'aXbXc'.replace('X', '', 1) }}",
    "{{ '{} + {} = {}'.format(1, 2, 3) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='x') }} {{ '{{literal}} {}'.format(none) }}",
    "{{ '-'.join(['a', 'b']) }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ 'a\\nb\\r\\nc'.splitlines() }}",
    "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ '  '.isspace() }} {{ 'ab'.isalpha() }} {{ 'ab1'.isalnum() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }}",
    "{{ {'a': 1, 'b': 2}.items() | list }} {{ {'a': 1}.keys() | list }} {{ {'a': 1}.values() | list }} {{ {'a': 1}.get('a') }} {{ {'a': 1}.get('z') }} {{ {'a': 1}.get('z', 'dflt') }}",
    "{% for k in messages[0].keys() %}{{ k }} {% endfor %}{% if messages[0].get('name') is none %}no name{% endif %}",
    "{{ messages[0].content.split('!')[0].strip().lower() }}",
]):
    small("method/%02d" % i, src)

# Errors: raise_exception, undefined calls, type errors, syntax errors.
for i, src in enumerate([
    "before{{ raise_exception('Only user and assistant roles are supported!') }}after",
    "{% if messages | length > 1 %}{{ raise_exception('Too many messages: ' ~ messages | length) }}{% endif %}",
    "{{ undefined_function() }}",
    "{{ 'a' + 1 }}",
    "{{ undefined_var.attr }}",
    "{{ messages[0].missing.deeper }}",
    "{{ 1 / 0 }}",
    "{{ none | length }}",
    "{% for x in none %}{% endfor %}",
    "{{ undefined_var | tojson }}",
    "{{ 1 < 'a' }}",
    "{% set x = 1 %}{% set x.attr = 2 %}",
    "{{ range(200000) | length }}",
    "{{ messages.append(1) }}",
    "{{ 'a' in 1 }}",
    "{{ -'a' }}",
    "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
    "{{ undefined_var + 1 }}",
    "{{ 5 is odd is even }}",
    "{{ 1 + 2 ~ 3 }}",
]):
    small("error/%02d" % i, src)

# Syntax errors (jinja2's line numbers are checked).
for i, src in enumerate([
    "{% if true %}no end",
    "line1\nline2 {% for x in y %}\n{{ x }}\n",
    "{{ 1 + }}",
    "{% if true %}\n{% endfor %}\n",
    "{{ 'unterminated }}",
    "{% unknown_tag %}",
    "{{ (1, 2 }}",
    "a\nb\n{{ x | }}",
    "{% for %}{% endfor %}",
    "{% set %}",
    "{{ foo( }}",
    "{% if x %}{% else %}{% else %}{% endif %}",
    "{# unterminated comment",
    "{% break %}",
    "text {{ }}",
    "{% macro m( %}{% endmacro %}",
]):
    small("syntax/%02d" % i, src)


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, source in FAMILIES.items():
        with open(os.path.join(OUT, name + ".jinja"), "w", encoding="utf-8", newline="") as f:
            f.write(source)
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/chat_template_fixtures.py", "jinja2": jinja2.__version__,
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum(1 for c in cases if "error" in c)
    print(f"{len(cases)} cases ({errors} errors) in {OUT}")


if __name__ == "__main__":
    main()
