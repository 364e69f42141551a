/* msm_chat_template: the model's chat template (tokenizer_config.json "chat_template"), rendered.
 *
 * Hugging Face stores a Jinja program there and renders it with Python's jinja2. msmoed does not
 * embed a Jinja interpreter: it recognises the templates of the model families it serves, compared
 * byte for byte with the known texts, and renders each with a C function written to give exactly
 * what apply_chat_template gives (tests/unit/test_chat_template.c checks every one against
 * renderings made by transformers: tests/golden/make_chat_templates.py). A template that is not
 * in the table is refused when it is loaded, with a message naming the file, so the chat endpoint
 * answers 501 instead of guessing a prompt format.
 *
 * Recognised: ChatML as Qwen1.5 ships it (the default system prompt, no <|im_end|> after a final
 * assistant turn), ChatML as Qwen2 ships it, plain ChatML, Qwen3's (ChatML with <think> blocks and
 * the enable_thinking switch; Qwen3-30B-A3B and its FP8 version), Mixtral-8x7B-Instruct-v0.1's
 * original [INST] template, and Mistral's "v1" [INST] template with an optional system message (the
 * current Mixtral and Mistral-7B-Instruct-v0.2 one).
 *
 * Immutable once loaded: rendering may run on any thread. */
#ifndef MSM_CHAT_TEMPLATE_H
#define MSM_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "msm_err.h"

typedef struct msm_chat_message {
    const char *role;         /* "system", "user" or "assistant" */
    const char *content;      /* UTF-8, NUL-terminated */
} msm_chat_message;

typedef struct msm_chat_template msm_chat_template;

/* What apply_chat_template is given besides the messages. */
typedef struct msm_chat_opts {
    bool add_generation_prompt;
    int enable_thinking;      /* the template variable: -1 undefined, 0 false, 1 true (Qwen3 reads it:
                                 false closes an empty <think> block after the generation prompt) */
} msm_chat_opts;

/* Reads tokenizer_config.json: its chat_template (a string; a list of named templates uses the one
 * named "default"), bos_token and eos_token (strings or {"content": ...} objects). -ENOENT when the
 * file does not exist or has no chat_template, -ENOTSUP when the template is not one msmoed
 * renders, -EINVAL when the file is not valid JSON; the message names the file. */
int msm_chat_template_load(const char *path, msm_chat_template **ret, msm_err *err);

/* The same from the template text and the special tokens (NULL: none). */
int msm_chat_template_new(const char *text, const char *bos, const char *eos, msm_chat_template **ret,
                          msm_err *err);

void msm_chat_template_free(msm_chat_template *t);

/* The family name ("qwen1.5-chatml", "mistral-v1", ...). */
const char *msm_chat_template_name(const msm_chat_template *t);

/* Renders n >= 1 messages; *ret is malloc'ed and NUL-terminated. -EINVAL with the template's own
 * message where the Jinja program raises (roles that do not alternate, a role it does not know). */
int msm_chat_template_render(const msm_chat_template *t, const msm_chat_message *m, int n, const msm_chat_opts *o,
                             char **ret, msm_err *err);

#endif
