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

/* o: add_generation_prompt and the template's variables (enable_thinking) */
typedef int (*render_fn)(const msm_chat_template *t, const msm_chat_message *m, int n, const msm_chat_opts *o,
                         msm_strbuf *b, msm_err *err);

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

static int render_qwen15(const msm_chat_template *t, const msm_chat_message *m, int n, const msm_chat_opts *o,
                         msm_strbuf *b, msm_err *err) {
    bool agp = o->add_generation_prompt;
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

static int render_qwen2(const msm_chat_template *t, const msm_chat_message *m, int n, const msm_chat_opts *o,
                        msm_strbuf *b, msm_err *err) {
    return render_chatml(m, n, o->add_generation_prompt, "You are a helpful assistant.", b);
}

static int render_plain_chatml(const msm_chat_template *t, const msm_chat_message *m, int n, const msm_chat_opts *o,
                               msm_strbuf *b, msm_err *err) {
    return render_chatml(m, n, o->add_generation_prompt, NULL, b);
}

/* ---- Qwen3 (ChatML with thinking) ---- */

/* Qwen3-*, Qwen3-30B-A3B, Qwen3-235B-A22B and their FP8 versions as released (April 2025). msmoed
 * renders what it can be sent (system, user and assistant messages with string content; no tools,
 * no reasoning_content field), which takes these branches of the program. */
static const char qwen3_text[] =
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n        {{-"
    " messages[0].content + '\\n\\n' }}\n    {%- endif %}\n    {{- \"# Tools\\n\\nYou may call one or more functi"
    "ons to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML"
    " tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n "
    "   {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name"
    " and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\""
    "arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0].rol"
    "e == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- en"
    "dif %}\n{%- endif %}\n{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "\n{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n    {%- "
    "if ns.multi_step_tool and message.role == \"user\" and not(message.content.startswith('<tool_response>') and"
    " message.content.endswith('</tool_response>')) %}\n        {%- set ns.multi_step_tool = false %}\n        {%"
    "- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n    {"
    "%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n        {{- '<|im_st"
    "art|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"as"
    "sistant\" %}\n        {%- set content = message.content %}\n        {%- set reasoning_content = '' %}\n     "
    "   {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n            {%-"
    " set reasoning_content = message.reasoning_content %}\n        {%- else %}\n            {%- if '</think>' in"
    " message.content %}\n                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %"
    "}\n                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<th"
    "ink>')[-1].lstrip('\\n') %}\n            {%- endif %}\n        {%- endif %}\n        {%- if loop.index0 > ns"
    ".last_query_index %}\n            {%- if loop.last or (not loop.last and reasoning_content) %}\n            "
    "    {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\"
    "n' + content.lstrip('\\n') }}\n            {%- else %}\n                {{- '<|im_start|>' + message.role + "
    "'\\n' + content }}\n            {%- endif %}\n        {%- else %}\n            {{- '<|im_start|>' + message."
    "role + '\\n' + content }}\n        {%- endif %}\n        {%- if message.tool_calls %}\n            {%- for t"
    "ool_call in message.tool_calls %}\n                {%- if (loop.first and content) or (not loop.first) %}\n "
    "                   {{- '\\n' }}\n                {%- endif %}\n                {%- if tool_call.function %}"
    "\n                    {%- set tool_call = tool_call.function %}\n                {%- endif %}\n             "
    "   {{- '<tool_call>\\n{\"name\": \"' }}\n                {{- tool_call.name }}\n                {{- '\", \"a"
    "rguments\": ' }}\n                {%- if tool_call.arguments is string %}\n                    {{- tool_call"
    ".arguments }}\n                {%- else %}\n                    {{- tool_call.arguments | tojson }}\n       "
    "         {%- endif %}\n                {{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- end"
    "if %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if loop.first o"
    "r (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif "
    "%}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>"
    "' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end"
    "|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '"
    "<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n       "
    " {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}";

static bool starts_with(const char *s, const char *p) {
    return strncmp(s, p, strlen(p)) == 0;
}

static bool ends_with(const char *s, const char *p) {
    size_t n = strlen(s), k = strlen(p);
    return n >= k && memcmp(s + n - k, p, k) == 0;
}

/* The last occurrence of p in [s, s + n), or NULL. */
static const char *last_in(const char *s, size_t n, const char *p) {
    size_t k = strlen(p);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (memcmp(s + i, p, k) == 0)
            return s + i;
    return NULL;
}

/* Python's [a, b).lstrip('\n') / .rstrip('\n') on a byte range. */
static void strip_nl(const char **a, const char **b, bool left, bool right) {
    while (left && *a < *b && **a == '\n')
        (*a)++;
    while (right && *b > *a && (*b)[-1] == '\n')
        (*b)--;
}

static int render_qwen3(const msm_chat_template *t, const msm_chat_message *m, int n, const msm_chat_opts *o,
                        msm_strbuf *b, msm_err *err) {
    if (is_role(&m[0], "system"))
        msm_strbuf_printf(b, "<|im_start|>system\n%s<|im_end|>\n", m[0].content);
    /* the last user message that is not a tool response (multi_step_tool), else the last message */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (is_role(&m[i], "user") &&
            !(starts_with(m[i].content, "<tool_response>") && ends_with(m[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        const char *c = m[i].content;
        if (is_role(&m[i], "user") || (is_role(&m[i], "system") && i > 0)) {
            msm_strbuf_printf(b, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, c);
        } else if (is_role(&m[i], "assistant")) {
            /* content and reasoning_content as the program splits them on </think> and <think> */
            const char *ca = c, *ce = c + strlen(c), *ra = "", *re = ra;
            const char *first = strstr(c, "</think>");
            if (first) {
                ca = last_in(c, strlen(c), "</think>") + strlen("</think>");
                strip_nl(&ca, &ce, true, false);
                ra = c, re = first;
                strip_nl(&ra, &re, false, true);
                const char *open = last_in(ra, (size_t)(re - ra), "<think>");
                if (open)
                    ra = open + strlen("<think>");
                strip_nl(&ra, &re, true, false);
            }
            bool last = i == n - 1;
            msm_strbuf_puts(b, "<|im_start|>assistant\n");
            if (i > last_query && (last || re > ra)) {
                strip_nl(&ra, &re, true, true);
                msm_strbuf_puts(b, "<think>\n");
                msm_strbuf_append(b, ra, (size_t)(re - ra));
                msm_strbuf_puts(b, "\n</think>\n\n");
                strip_nl(&ca, &ce, true, false);
            }
            msm_strbuf_append(b, ca, (size_t)(ce - ca));
            msm_strbuf_puts(b, "<|im_end|>\n");
        }
    }
    if (o->add_generation_prompt) {
        msm_strbuf_puts(b, "<|im_start|>assistant\n");
        if (o->enable_thinking == 0)
            msm_strbuf_puts(b, "<think>\n\n</think>\n\n");
    }
    return 0;
}

/* ---- [INST] (Mistral, Mixtral) ---- */

/* Mixtral-8x7B-Instruct-v0.1 as first released: user and assistant only, alternating. */
static const char mixtral_text[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

static int render_mixtral(const msm_chat_template *t, const msm_chat_message *m, int n, const msm_chat_opts *o,
                          msm_strbuf *b, msm_err *err) {
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

static int render_mistral_v1(const msm_chat_template *t, const msm_chat_message *m, int n, const msm_chat_opts *o,
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
    {"qwen3", qwen3_text, render_qwen3},
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
                           "renders (known: Qwen1.5 and Qwen2 ChatML, plain ChatML, Qwen3, Mixtral v0.1 and Mistral "
                           "v1 [INST])", strlen(text), text);
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

int msm_chat_template_render(const msm_chat_template *t, const msm_chat_message *m, int n, const msm_chat_opts *o,
                             char **ret, msm_err *err) {
    if (n < 1)
        return msm_err_set(err, -EINVAL, "no messages");
    msm_strbuf b = {0};
    int rc = t->known->render(t, m, n, o, &b, err);
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
