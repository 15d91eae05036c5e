// A chat template written for the tests in the style of Llama 3.1's tool use (with its own marker
// tokens): tools as JSON schemas (tojson with indent) in the first user turn or the system turn, one
// assistant call per turn rendered as {"name": ..., "parameters": {...}}, results in an ipython turn.
// test_chat_template.cpp checks that transformers renders it as hybridflow does; test_tool_calls.cpp
// parses the calls it renders back.
#pragma once

namespace hybridflow::text {

inline const char* const kToolsInUserTurnTemplate = R"TPL({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "01 Jan 2030" %}
{%- endif %}
{%- if tools is not defined %}
    {%- set tools = none %}
{%- endif %}

{#- The system turn comes out of the list first #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{{- "<|hdr|>system<|/hdr|>\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "Functions you may call are listed below.\n" }}
{%- endif %}
{{- "Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot|>" }}

{%- if tools_in_user_message and tools is not none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content'] | trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Tools go in the first user turn, and there is none.") }}
    {%- endif %}
    {{- '<|hdr|>user<|/hdr|>\n\n' -}}
    {{- "Reply with one JSON call shaped like " }}
    {{- '{"name": <name>, "parameters": {<arg>: <value>}}.\n\n' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|hdr|>' + message['role'] + '<|/hdr|>\n\n'+ message['content'] | trim + '<|eot|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("One tool call per turn, please.") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|hdr|>assistant<|/hdr|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|hdr|>ipython<|/hdr|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable and message.content is not string %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|hdr|>assistant<|/hdr|>\n\n' }}
{%- endif %}
)TPL";

}  // namespace hybridflow::text
