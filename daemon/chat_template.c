/* msm_chat_template: the known chat templates and their renderers (see msm_chat_template.h).
 *
 * Each entry holds a template's exact text, as its tokenizer_config.json has it, and a function
 * that does what that Jinja program does. The texts are compared byte for byte: a template that
 * differs in anything (a changed default system prompt, a stray space) is not recognised. */
#include "msm_chat_template.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "msm_strbuf.h"

struct msm_chat_template {
    const struct known *known;
    char *bos, *eos;          /* "" when the config names none */
};

typedef int (*render_fn)(const msm_chat_template *t, const msm_chat_message *m, int n, bool agp, msm_strbuf *b,
                         msm_err *err);

typedef struct known {
    const char *name;
    const char *text;
    render_fn render;
} known;

static bool is_role(const msm_chat_message *m, const char *role) {
    return strcmp(m->role, role) == 0;
}

/* ---- ChatML (Qwen) ---- */

/* Qwen1.5-*-Chat, Qwen1.5-MoE-A2.7B-Chat. */
static const char qwen15_text[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
    "are a helpful assistant<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content']}}{% if (loop.last and add_generation_prompt) or not loop.last %}{{ '<|im_end|>' + '\\n'}}{% "
    "endif %}{% endfor %}{% if add_generation_prompt and messages[-1]['role'] != 'assistant' %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

static int render_qwen15(const msm_chat_template *t, const msm_chat_message *m, int n, bool agp, msm_strbuf *b,
                         msm_err *err) {
    for (int i = 0; i < n; i++) {
        bool last = i == n - 1;
        if (i == 0 && !is_role(&m[0], "system"))
            msm_strbuf_puts(b, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n");
        msm_strbuf_printf(b, "<|im_start|>%s\n%s", m[i].role, m[i].content);
        if ((last && agp) || !last)
            msm_strbuf_puts(b, "<|im_end|>\n");
    }
    if (agp && !is_role(&m[n - 1], "assistant"))
        msm_strbuf_puts(b, "<|im_start|>assistant\n");
    return 0;
}

/* Qwen2-*-Instruct, Qwen2-57B-A14B-Instruct. */
static const char qwen2_text[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
    "are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

/* Plain ChatML: no default system prompt. */
static const char chatml_text[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static int render_chatml(const msm_chat_message *m, int n, bool agp, const char *default_system, msm_strbuf *b) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && default_system && !is_role(&m[0], "system"))
            msm_strbuf_printf(b, "<|im_start|>system\n%s<|im_end|>\n", default_system);
        msm_strbuf_printf(b, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
    }
    if (agp)
        msm_strbuf_puts(b, "<|im_start|>assistant\n");
    return 0;
}

static int render_qwen2(const msm_chat_template *t, const msm_chat_message *m, int n, bool agp, msm_strbuf *b,
                        msm_err *err) {
    return render_chatml(m, n, agp, "You are a helpful assistant.", b);
}

static int render_plain_chatml(const msm_chat_template *t, const msm_chat_message *m, int n, bool agp,
                               msm_strbuf *b, msm_err *err) {
    return render_chatml(m, n, agp, NULL, b);
}

/* ---- [INST] (Mistral, Mixtral) ---- */

/* Mixtral-8x7B-Instruct-v0.1 as first released: user and assistant only, alternating. */
static const char mixtral_text[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

static int render_mixtral(const msm_chat_template *t, const msm_chat_message *m, int n, bool agp, msm_strbuf *b,
                          msm_err *err) {
    msm_strbuf_puts(b, t->bos);
    for (int i = 0; i < n; i++) {
        if (is_role(&m[i], "user") != (i % 2 == 0))
            return msm_err_set(err, -EINVAL, "Conversation roles must alternate user/assistant/user/assistant/...");
        if (is_role(&m[i], "user"))
            msm_strbuf_printf(b, "[INST] %s [/INST]", m[i].content);
        else if (is_role(&m[i], "assistant"))
            msm_strbuf_printf(b, "%s%s", m[i].content, t->eos);
        else
            return msm_err_set(err, -EINVAL, "Only user and assistant roles are supported!");
    }
    return 0;
}

/* Mistral's "v1" template: an optional leading system message joins the first user turn. */
static const char mistral_v1_text[] =
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set "
    "loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- "
    "bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == "
    "0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- "
    "if loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + "
    "message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' "
    "[/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + "
    "message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles "
    "are supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor "
    "%}\n";

static int render_mistral_v1(const msm_chat_template *t, const msm_chat_message *m, int n, bool agp,
                             msm_strbuf *b, msm_err *err) {
    const char *system = NULL;
    if (is_role(&m[0], "system")) {
        system = m[0].content;
        m++;
        n--;
    }
    msm_strbuf_puts(b, t->bos);
    for (int i = 0; i < n; i++) {
        if (is_role(&m[i], "user") != (i % 2 == 0))
            return msm_err_set(err, -EINVAL, "After the optional system message, conversation roles must alternate "
                               "user/assistant/user/assistant/...");
        if (is_role(&m[i], "user") && i == 0 && system)
            msm_strbuf_printf(b, " [INST] %s\n\n%s [/INST]", system, m[i].content);
        else if (is_role(&m[i], "user"))
            msm_strbuf_printf(b, " [INST] %s [/INST]", m[i].content);
        else if (is_role(&m[i], "assistant"))
            msm_strbuf_printf(b, " %s%s", m[i].content, t->eos);
        else
            return msm_err_set(err, -EINVAL, "Only user and assistant roles are supported, with the exception of an "
                               "initial optional system message!");
    }
    return 0;
}

static const known table[] = {
    {"qwen1.5-chatml", qwen15_text, render_qwen15},
    {"qwen2-chatml", qwen2_text, render_qwen2},
    {"chatml", chatml_text, render_plain_chatml},
    {"mixtral-v0.1", mixtral_text, render_mixtral},
    {"mistral-v1", mistral_v1_text, render_mistral_v1},
};

/* ---- loading ---- */

int msm_chat_template_new(const char *text, const char *bos, const char *eos, msm_chat_template **ret,
                          msm_err *err) {
    const known *k = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0] && !k; i++)
        if (strcmp(text, table[i].text) == 0)
            k = &table[i];
    if (!k)
        return msm_err_set(err, -ENOTSUP, "the chat template (%zu bytes, starting \"%.40s\") is not one msmoed "
                           "renders (known: Qwen1.5 and Qwen2 ChatML, plain ChatML, Mixtral v0.1 and Mistral v1 "
                           "[INST])", strlen(text), text);
    msm_chat_template *t = calloc(1, sizeof *t);
    if (!t || !(t->bos = strdup(bos ? bos : "")) || !(t->eos = strdup(eos ? eos : ""))) {
        msm_chat_template_free(t);
        return msm_err_set(err, -ENOMEM, "out of memory");
    }
    t->known = k;
    *ret = t;
    return 0;
}

void msm_chat_template_free(msm_chat_template *t) {
    if (!t)
        return;
    free(t->bos);
    free(t->eos);
    free(t);
}

const char *msm_chat_template_name(const msm_chat_template *t) {
    return t->known->name;
}

/* bos_token / eos_token: a string or an AddedToken object {"content": ...}; NULL when absent. */
static const char *special_token(json_object *cfg, const char *key) {
    json_object *v;
    if (!json_object_object_get_ex(cfg, key, &v))
        return NULL;
    if (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "content", &v))
        return json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
    return json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

/* chat_template: a string, or a list of {"name", "template"} of which "default" is the one. */
static const char *template_text(json_object *cfg) {
    json_object *v;
    if (!json_object_object_get_ex(cfg, "chat_template", &v))
        return NULL;
    if (json_object_is_type(v, json_type_string))
        return json_object_get_string(v);
    if (!json_object_is_type(v, json_type_array))
        return NULL;
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i), *name, *text;
        if (json_object_object_get_ex(e, "name", &name) && json_object_object_get_ex(e, "template", &text) &&
            json_object_is_type(text, json_type_string) && !strcmp(json_object_get_string(name), "default"))
            return json_object_get_string(text);
    }
    return NULL;
}

int msm_chat_template_load(const char *path, msm_chat_template **ret, msm_err *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return msm_err_set(err, -ENOENT, "%s: cannot open: %s", path, strerror(errno));
    fclose(f);
    json_object *cfg = json_object_from_file(path);
    if (!cfg)
        return msm_err_set(err, -EINVAL, "%s: not valid JSON: %s", path, json_util_get_last_err());
    int rc;
    const char *text = template_text(cfg);
    if (!text)
        rc = msm_err_set(err, -ENOENT, "%s has no chat_template", path);
    else if ((rc = msm_chat_template_new(text, special_token(cfg, "bos_token"), special_token(cfg, "eos_token"),
                                         ret, err)) < 0)
        msm_err_wrap(err, rc, "%s", path);
    json_object_put(cfg);
    return rc;
}

int msm_chat_template_render(const msm_chat_template *t, const msm_chat_message *m, int n,
                             bool add_generation_prompt, char **ret, msm_err *err) {
    if (n < 1)
        return msm_err_set(err, -EINVAL, "no messages");
    msm_strbuf b = {0};
    int rc = t->known->render(t, m, n, add_generation_prompt, &b, err);
    if (rc < 0) {
        msm_strbuf_done(&b);
        return rc;
    }
    char *s = msm_strbuf_take(&b, NULL);
    if (!s)
        return msm_err_set(err, -ENOMEM, "out of memory");
    *ret = s;
    return 0;
}
