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
}

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
                case = {"messages": msgs, "add_generation_prompt": agp}
                try:
                    case["rendered"] = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp)
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
