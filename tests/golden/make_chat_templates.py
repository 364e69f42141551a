#!/usr/bin/env python3
"""Reference renderings of the chat templates msmoed recognises (daemon/chat_template.c), made by
Hugging Face transformers' apply_chat_template. CI never runs this script; its output,
tests/data/chat_templates/cases.json, is committed and read by tests/unit/test_chat_template.c,
which renders every case with msmoed's C renderer and requires the same text (or an error where
the Jinja program raises).

Run:  python3 -m venv /tmp/tfv && /tmp/tfv/bin/pip install transformers tokenizers jinja2
      /tmp/tfv/bin/python tests/golden/make_chat_templates.py
Templates are the exact chat_template strings of the tokenizer_config.json files named below.
"""
import json
import os
import sys

import transformers as T
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

# name -> (source, template text, bos_token, eos_token)
TEMPLATES = {
    "qwen1.5-chatml": (
        "Qwen/Qwen1.5-MoE-A2.7B-Chat (also Qwen1.5-*-Chat)",
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']}}{% if (loop.last and add_generation_prompt) or not loop.last %}{{ '<|im_end|>' + '\\n'}}{% endif %}{% endfor %}{% if add_generation_prompt and messages[-1]['role'] != 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        None, "<|im_end|>"),
    "qwen2-chatml": (
        "Qwen/Qwen2-57B-A14B-Instruct (also Qwen2-*-Instruct)",
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        None, "<|im_end|>"),
    "chatml": (
        "plain ChatML (no default system prompt)",
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        None, "<|im_end|>"),
    "mixtral-v0.1": (
        "mistralai/Mixtral-8x7B-Instruct-v0.1 as first released",
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
        "<s>", "</s>"),
    "mistral-v1": (
        "mistralai/Mixtral-8x7B-Instruct-v0.1 and Mistral-7B-Instruct-v0.2 (Mistral's v1 template)",
        "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n",
        "<s>", "</s>"),
    "qwen3": (
        "Qwen/Qwen3-0.6B's tokenizer_config.json (as llama.cpp's scripts/get_chat_template.py saved it, byte "
        "for byte, models/templates/Qwen-Qwen3-0.6B.jinja); the April 2025 Qwen3 releases, Qwen3-30B-A3B and "
        "its FP8 version among them, ship this template",
        "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0].role == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n    {%- if ns.multi_step_tool and message.role == \"user\" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {%- set content = message.content %}\n        {%- set reasoning_content = '' %}\n        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n            {%- set reasoning_content = message.reasoning_content %}\n        {%- else %}\n            {%- if '</think>' in message.content %}\n                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n            {%- endif %}\n        {%- endif %}\n        {%- if loop.index0 > ns.last_query_index %}\n            {%- if loop.last or (not loop.last and reasoning_content) %}\n                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n            {%- else %}\n                {{- '<|im_start|>' + message.role + '\\n' + content }}\n            {%- endif %}\n        {%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- endif %}\n        {%- if message.tool_calls %}\n            {%- for tool_call in message.tool_calls %}\n                {%- if (loop.first and content) or (not loop.first) %}\n                    {{- '\\n' }}\n                {%- endif %}\n                {%- if tool_call.function %}\n                    {%- set tool_call = tool_call.function %}\n                {%- endif %}\n                {{- '<tool_call>\\n{\"name\": \"' }}\n                {{- tool_call.name }}\n                {{- '\", \"arguments\": ' }}\n                {%- if tool_call.arguments is string %}\n                    {{- tool_call.arguments }}\n                {%- else %}\n                    {{- tool_call.arguments | tojson }}\n                {%- endif %}\n                {{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}",
        None, "<|im_end|>"),
}
# the template variables a case sets besides add_generation_prompt (msm_chat_opts): the templates
# that read none render the same for each, so only those that do get the extra cases
THINKING = {"qwen3"}

U, A, S = "user", "assistant", "system"
CONVERSATIONS = [
    [(U, "Hello")],
    [(S, "You are terse."), (U, "Hi there")],
    [(U, "What is 2+2?"), (A, "4"), (U, "And 3+3?")],
    [(U, "Tell me a story."), (A, "Once upon a time")],
    [(S, "Be kind."), (U, "Hello"), (A, "Hi!"), (U, "How are you?")],
    [(U, "Grüße 🙂\nsecond line\twith a tab, \"quotes\" and \\ backslash")],
    [(U, "  spaces around  "), (A, " reply ")],
    [(A, "I speak first")],
    [(U, "one"), (U, "two")],
    [(S, "only a system message")],
    [(U, "a"), (A, "b"), (S, "late system")],
    # reasoning in an assistant turn (Qwen3 splits it off at </think>, keeps it after the last query)
    [(U, "Why?"), (A, "<think>\nBecause.\n</think>\n\nIt is so.")],
    [(U, "Q1"), (A, "<think>r1</think>a1"), (U, "Q2"), (A, "\n<think>\n\nr2\n\n</think>\n\n\na2")],
    [(U, "Q"), (A, "x<think>a</think>b</think>\nc")],
    [(U, "Q"), (A, "no open tag</think>after")],
    [(U, "Q"), (A, "<think></think>")],
    # a user turn that is a tool response does not count as the last query
    [(U, "Q"), (A, "<think>t</think>call"), (U, "<tool_response>\n42\n</tool_response>"), (A, "<think>u</think>done")],
    [(U, "<tool_response>only</tool_response>"), (A, "<think>v</think>w")],
    [(S, "sys"), (A, "<think>x</think>y"), (A, "z")],
]


def main():
    out = []
    for name, (source, text, bos, eos) in TEMPLATES.items():
        tok = T.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"x": 0}, unk_token="x")))
        tok.chat_template = text
        if bos is not None:
            tok.bos_token = bos
        tok.eos_token = eos
        cases = []
        for conv in CONVERSATIONS:
            msgs = [{"role": r, "content": c} for r, c in conv]
            for agp in (False, True):
                for think in ((None, False, True) if name in THINKING else (None,)):
                    case = {"messages": msgs, "add_generation_prompt": agp}
                    kw = {}
                    if think is not None:
                        case["enable_thinking"] = kw["enable_thinking"] = think
                    try:
                        case["rendered"] = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp,
                                                                   **kw)
                    except Exception as e:  # jinja2 TemplateError from raise_exception
                        case["error"] = str(e)
                    cases.append(case)
        out.append({"name": name, "source": source, "template": text, "bos_token": bos, "eos_token": eos,
                    "cases": cases})
    path = os.path.join(os.path.dirname(__file__), "..", "data", "chat_templates", "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/golden/make_chat_templates.py", "transformers": T.__version__,
                   "templates": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {sum(len(t['cases']) for t in out)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
