/* Unit tests of the chat template recognizer (daemon/chat_template.c) against Hugging Face's
 * apply_chat_template (tests/data/chat_templates/cases.json, made by
 * tests/golden/make_chat_templates.py with transformers), and of the OpenAI request parsing that
 * uses it (daemon/http_openai.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "msm_chat_template.h"
#include "msm_openai.h"
#include "testutil.h"

static const char *str_or_null(json_object *o, const char *key) {
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string) ? json_object_get_string(v)
                                                                                             : NULL;
}

Test(chat_template, every_known_template_renders_as_transformers_does) {
    json_object *root = json_object_from_file("tests/data/chat_templates/cases.json"), *templates;
    cr_assert_not_null(root, "tests/data/chat_templates/cases.json");
    cr_assert(json_object_object_get_ex(root, "templates", &templates));
    int checked = 0;
    for (size_t t = 0; t < json_object_array_length(templates); t++) {
        json_object *tj = json_object_array_get_idx(templates, t), *cases;
        const char *name = str_or_null(tj, "name");
        msm_chat_template *ct = NULL;
        msm_err err = {{0}};
        cr_assert_eq(msm_chat_template_new(str_or_null(tj, "template"), str_or_null(tj, "bos_token"),
                                           str_or_null(tj, "eos_token"), &ct, &err), 0, "%s: %s", name, err.msg);
        cr_assert_str_eq(msm_chat_template_name(ct), name);
        cr_assert(json_object_object_get_ex(tj, "cases", &cases));
        for (size_t c = 0; c < json_object_array_length(cases); c++) {
            json_object *cj = json_object_array_get_idx(cases, c), *msgs, *agp, *think;
            json_object_object_get_ex(cj, "messages", &msgs);
            json_object_object_get_ex(cj, "add_generation_prompt", &agp);
            /* enable_thinking: absent (undefined in the template), true or false */
            msm_chat_opts o = {.add_generation_prompt = json_object_get_boolean(agp), .enable_thinking = -1};
            if (json_object_object_get_ex(cj, "enable_thinking", &think))
                o.enable_thinking = json_object_get_boolean(think);
            int n = (int)json_object_array_length(msgs);
            msm_chat_message m[16];
            for (int i = 0; i < n; i++) {
                json_object *mj = json_object_array_get_idx(msgs, (size_t)i);
                m[i].role = str_or_null(mj, "role");
                m[i].content = str_or_null(mj, "content");
            }
            char *out = NULL;
            int rc = msm_chat_template_render(ct, m, n, &o, &out, &err);
            const char *want = str_or_null(cj, "rendered"), *want_err = str_or_null(cj, "error");
            if (want) {
                cr_assert_eq(rc, 0, "%s case %zu: %s", name, c, err.msg);
                cr_assert_str_eq(out, want, "%s case %zu", name, c);
            } else {
                cr_assert_eq(rc, -EINVAL, "%s case %zu renders, transformers raised: %s", name, c, want_err);
                cr_assert_str_eq(err.msg, want_err, "%s case %zu", name, c);
            }
            free(out);
            checked++;
        }
        msm_chat_template_free(ct);
    }
    cr_assert_geq(checked, 200);
    json_object_put(root);
}

Test(chat_template, an_unknown_template_is_refused_with_a_reason) {
    msm_chat_template *ct = NULL;
    msm_err err = {{0}};
    /* a known one changed by one space */
    cr_assert_eq(msm_chat_template_new("{{ bos_token }} {% for message in messages %}{% endfor %}", "<s>", "</s>", &ct,
                                       &err), -ENOTSUP);
    cr_assert_null(ct);
    cr_assert(strstr(err.msg, "not one msmoed renders"), "%s", err.msg);
}

Test(chat_template, loads_from_tokenizer_config_with_added_token_objects) {
    char path[] = "/tmp/msm_chat_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char *cfg = "{\"bos_token\": {\"content\": \"<s>\", \"special\": true}, \"eos_token\": \"</s>\", "
                      "\"chat_template\": \"{{ bos_token }}{% for message in messages %}{% if (message['role'] == "
                      "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
                      "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' "
                      "+ message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
                      "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
                      "are supported!') }}{% endif %}{% endfor %}\"}";
    cr_assert_eq(write(fd, cfg, strlen(cfg)), (ssize_t)strlen(cfg));
    close(fd);
    msm_chat_template *ct = NULL;
    msm_err err = {{0}};
    cr_assert_eq(msm_chat_template_load(path, &ct, &err), 0, "%s", err.msg);
    msm_chat_message m[2] = {{"user", "Hi"}, {"assistant", "Hello"}};
    char *out = NULL;
    cr_assert_eq(msm_chat_template_render(ct, m, 2, &(msm_chat_opts){.add_generation_prompt = true, .enable_thinking = -1},
                                          &out, &err), 0);
    cr_assert_str_eq(out, "<s>[INST] Hi [/INST]Hello</s>");
    free(out);
    msm_chat_template_free(ct);
    unlink(path);
    cr_assert_eq(msm_chat_template_load("/nonexistent/tokenizer_config.json", &ct, &err), -ENOENT);
}

/* ---- OpenAI request parsing ---- */

static msm_api_limits limits(void) {
    return (msm_api_limits){.vocab = 512, .max_context = 512, .max_tokens_default = 256, .max_tokens_limit = 4096,
                            .max_logprobs = 20, .max_stop = 4, .tok = test_stories_tokenizer()};
}

typedef struct bad_case {
    const char *body;
    int status;
    const char *param;
} bad_case;

Test(openai, bad_completion_requests_name_the_field) {
    static const bad_case cases[] = {
        {"{\"prompt\": \"hi\"", 400, ""},                                   /* malformed JSON */
        {"[1, 2]", 400, ""},                                                /* not an object */
        {"", 400, ""},                                                      /* empty body */
        {"{\"prompt\": \"hi\", \"frobnicate\": 1}", 400, "frobnicate"},     /* unknown field */
        {"{\"prompt\": 5}", 400, "prompt"},                                 /* wrong type */
        {"{}", 400, "prompt"},                                              /* missing */
        {"{\"prompt\": \"hi\", \"max_tokens\": -1}", 400, "max_tokens"},
        {"{\"prompt\": \"hi\", \"max_tokens\": \"5\"}", 400, "max_tokens"},
        {"{\"prompt\": \"hi\", \"max_tokens\": 0}", 400, "max_tokens"},     /* 0 without echo */
        {"{\"prompt\": \"hi\", \"logprobs\": 21}", 400, "logprobs"},
        {"{\"prompt\": \"hi\", \"n\": 0}", 400, "n"},
        {"{\"prompt\": \"hi\", \"n\": 2, \"best_of\": 3}", 400, "best_of"},
        {"{\"prompt\": \"hi\", \"temperature\": 3}", 400, "temperature"},
        {"{\"prompt\": \"hi\", \"top_p\": 0}", 400, "top_p"},
        {"{\"prompt\": \"hi\", \"stop\": [\"a\", 3]}", 400, "stop[1]"},
        {"{\"prompt\": \"hi\", \"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}", 400, "stop"},
        {"{\"prompt\": [1, 2, 600]}", 400, "prompt"},
        {"{\"prompt\": [[1, 2], \"x\", 7]}", 400, "prompt[2]"},
        {"{\"prompt\": \"hi\", \"model\": \"gpt-4\"}", 404, "model"},
        {"{\"prompt\": \"hi\", \"presence_penalty\": 0.5}", 400, "presence_penalty"},
        {"{\"prompt\": \"hi\", \"stream_options\": {\"include_usage\": true}}", 400, "stream_options"},
    };
    msm_api_limits lim = limits();
    msm_oai_ctx c = {.lim = &lim, .model = "stories260k-moe", .chat_off = "none"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        msm_oai_request r;
        msm_oai_error e = {0};
        int rc = msm_oai_parse_completion(&c, cases[i].body, strlen(cases[i].body), &r, &e);
        cr_assert_lt(rc, 0, "case %zu accepted: %s", i, cases[i].body);
        cr_assert_eq(e.status, cases[i].status, "case %zu: %d %s", i, e.status, e.msg.msg);
        if (cases[i].param[0])
            cr_assert_str_eq(e.param, cases[i].param, "case %zu: %s", i, e.msg.msg);
        size_t len;
        char *json = msm_oai_error_json(&e, &len);
        json_object *o = json_tokener_parse(json), *err;
        cr_assert(json_object_object_get_ex(o, "error", &err), "%s", json);
        json_object_put(o);
        free(json);
    }
}

Test(openai, invalid_utf8_in_the_body_is_refused) {
    msm_api_limits lim = limits();
    msm_oai_ctx c = {.lim = &lim, .model = "m", .chat_off = "none"};
    const char body[] = "{\"prompt\": \"\xff\xfe\"}";
    msm_oai_request r;
    msm_oai_error e = {0};
    cr_assert_lt(msm_oai_parse_completion(&c, body, sizeof body - 1, &r, &e), 0);
    cr_assert_eq(e.status, 400);
}

Test(openai, a_batch_of_prompts_with_n_samples) {
    msm_api_limits lim = limits();
    msm_oai_ctx c = {.lim = &lim, .model = "m", .chat_off = "none"};
    const char *body = "{\"prompt\": [\"Once upon a time\", [1, 403, 407]], \"n\": 2, \"max_tokens\": 7, "
                       "\"temperature\": 0.5, \"seed\": 9, \"stop\": \".\", \"echo\": true, \"logprobs\": 3}";
    msm_oai_request r;
    msm_oai_error e = {0};
    cr_assert_eq(msm_oai_parse_completion(&c, body, strlen(body), &r, &e), 0, "%s", e.msg.msg);
    cr_assert_eq(r.n_prompts, 2);
    cr_assert_eq(r.n, 2);
    cr_assert_eq(r.prompts[0].ids[0], 1, "text prompts get the BOS");
    cr_assert_eq(r.prompts[1].n, 3);
    msm_gen_request *g = msm_oai_gen_request(&r, 3);
    cr_assert_eq(g->n_prompt, 3);
    cr_assert_eq(g->max_tokens, 7);
    cr_assert_eq(g->sampling.seed, 10, "the second sample of a prompt: seed + 1");
    cr_assert(g->want_prompt_logprobs);
    cr_assert_eq(g->prompt_top_logprobs, 3);
    cr_assert_eq(g->n_stop_strings, 1);
    msm_gen_request_free(g);
    msm_oai_request_done(&r);
}

Test(openai, chat_without_a_template_answers_501_and_with_one_renders) {
    msm_api_limits lim = limits();
    msm_oai_ctx c = {.lim = &lim, .model = "m", .chat_off = "no tokenizer_config.json"};
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"logprobs\": true, "
                       "\"top_logprobs\": 2}";
    msm_oai_request r;
    msm_oai_error e = {0};
    cr_assert_lt(msm_oai_parse_chat(&c, body, strlen(body), &r, &e), 0);
    cr_assert_eq(e.status, 501);
    msm_err err;
    cr_assert_eq(msm_chat_template_new("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
                                       "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
                                       "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == "
                                       "'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif "
                                       "message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else "
                                       "%}{{ raise_exception('Only user and assistant roles are supported!') }}{% "
                                       "endif %}{% endfor %}", "<s>", "</s>", (msm_chat_template **)&c.chat, &err),
                 0, "%s", err.msg);
    cr_assert_eq(msm_oai_parse_chat(&c, body, strlen(body), &r, &e), 0, "%s", e.msg.msg);
    cr_assert_eq(r.prompts[0].ids[0], 1, "the template's <s> is the BOS token");
    cr_assert_eq(r.logprobs, 2);
    msm_oai_request_done(&r);
    const char *bad = "{\"messages\": [{\"role\": \"assistant\", \"content\": \"first\"}]}";
    cr_assert_lt(msm_oai_parse_chat(&c, bad, strlen(bad), &r, &e), 0);
    cr_assert_eq(e.status, 400);
    cr_assert(strstr(e.msg.msg, "alternate"), "%s", e.msg.msg);
    const char *role = "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}";
    cr_assert_lt(msm_oai_parse_chat(&c, role, strlen(role), &r, &e), 0);
    cr_assert_str_eq(e.param, "messages[0].role");
    msm_chat_template_free((msm_chat_template *)c.chat);
}

/* chat_template_kwargs (vLLM's): enable_thinking reaches the template (Qwen3's: false closes an
 * empty <think> block after the generation prompt, so the prompt grows; null and true leave it
 * undefined / open, the same prompt for Qwen3); anything else is refused naming the field. */
Test(openai, chat_template_kwargs_enable_thinking_reaches_the_template) {
    json_object *root = json_object_from_file("tests/data/chat_templates/cases.json"), *templates;
    cr_assert_not_null(root);
    cr_assert(json_object_object_get_ex(root, "templates", &templates));
    const char *qwen3 = NULL;
    for (size_t t = 0; t < json_object_array_length(templates); t++) {
        json_object *tj = json_object_array_get_idx(templates, t);
        if (!strcmp(str_or_null(tj, "name"), "qwen3"))
            qwen3 = str_or_null(tj, "template");
    }
    cr_assert_not_null(qwen3);
    msm_api_limits lim = limits();
    msm_oai_ctx c = {.lim = &lim, .model = "m", .chat_off = "none"};
    msm_err err;
    cr_assert_eq(msm_chat_template_new(qwen3, NULL, "<|im_end|>", (msm_chat_template **)&c.chat, &err), 0, "%s",
                 err.msg);
    cr_assert_str_eq(msm_chat_template_name(c.chat), "qwen3");
    static const char *const kw[] = {"", ", \"chat_template_kwargs\": {\"enable_thinking\": true}",
                                     ", \"chat_template_kwargs\": {\"enable_thinking\": null}",
                                     ", \"chat_template_kwargs\": {\"enable_thinking\": false}"};
    int len[4];
    for (int i = 0; i < 4; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]%s}", kw[i]);
        msm_oai_request r;
        msm_oai_error e = {0};
        cr_assert_eq(msm_oai_parse_chat(&c, body, strlen(body), &r, &e), 0, "%s: %s", body, e.msg.msg);
        len[i] = r.prompts[0].n;
        msm_oai_request_done(&r);
    }
    cr_assert_eq(len[1], len[0], "enable_thinking true: the template's default");
    cr_assert_eq(len[2], len[0], "null: undefined");
    cr_assert_gt(len[3], len[0], "enable_thinking false: the empty <think> block");
    static const char *const bad[] = {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                                      "\"chat_template_kwargs\": [true]}",
                                      "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                                      "\"chat_template_kwargs\": {\"enable_thinking\": \"no\"}}",
                                      "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                                      "\"chat_template_kwargs\": {\"tools\": []}}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        msm_oai_request r;
        msm_oai_error e = {0};
        cr_assert_lt(msm_oai_parse_chat(&c, bad[i], strlen(bad[i]), &r, &e), 0, "%s", bad[i]);
        cr_assert_eq(e.status, 400);
        cr_assert_str_eq(e.param, "chat_template_kwargs", "%s", bad[i]);
    }
    msm_chat_template_free((msm_chat_template *)c.chat);
    json_object_put(root);
}
