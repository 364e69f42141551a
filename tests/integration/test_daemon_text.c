/* Integration tests of msmoed's text side (suite daemon_text), on the embedded model and its
 * tokenizer.json: text prompts and streamed text equal msmoe-run's, stop strings, Tokenize and
 * Detokenize, text errors, a missing or broken tokenizer, and the CLI's text commands.
 * Helpers: daemon_helpers.h. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <unistr.h>

#include "daemon_helpers.h"
#include "msm_client.h"
#include "msm_frame.h"

/* ---- text: prompt_text, text deltas, stop strings, Tokenize / Detokenize ---- */

/* msmoe-run --prompt TEXT --text: the ids (first line) and the decoded text (the rest). */
static int run_msmoe_run_text(const char *prompt, int max_new, int32_t *ids, int cap, char *text, size_t text_cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --model %s --prompt '%s' --max-new-tokens %d --greedy --text",
             env_or("MSMOE_RUN", "build/tools/msmoe-run"), env_or("MSMOE_MODEL", "models/stories260k-moe"), prompt,
             max_new);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char out[65536];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s failed", cmd);
    char *nl = strchr(out, '\n');
    cr_assert_not_null(nl, "%s: no ids line", cmd);
    *nl = 0;
    int k = 0;
    for (char *q = out; *q && k < cap;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q)
            break;
        ids[k++] = (int32_t)v;
        q = *end == ',' ? end + 1 : end;
    }
    size_t tl = strlen(nl + 1);
    cr_assert(tl > 0 && nl[tl] == '\n', "%s: no text line", cmd);
    nl[tl] = 0; /* msmoe-run ends the text with a newline */
    snprintf(text, text_cap, "%s", nl + 1);
    return k;
}

static void text_gen_init(msm_client_gen *g, const char *prompt, int max_tokens) {
    msm_client_gen_init(g);
    g->prompt_text = prompt;
    g->max_tokens = max_tokens;
    g->temperature = 0;
    g->set_temperature = true;
}

Test(daemon_text, text_generate_equals_msmoe_run, .timeout = 180) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    msm_err err;
    cr_assert_eq(msm_client_send_simple(c, 1, MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert(f->model_info->has_tokenizer, "ModelInfo: no tokenizer");
    cr_assert(strstr(f->model_info->tokenizer, "tokenizer.json"), "%s", f->model_info->tokenizer);
    cr_assert_eq(f->model_info->tokenizer_vocab, 512);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    /* Plain text; a prompt whose continuation starts a new word; an emoji (byte-fallback tokens)
     * and accented letters; all in flight at once on one connection. */
    static const char *prompts[] = {"Once upon a time", "Tom and Lily went to the park. They",
                                    "Lily saw a \xf0\x9f\x99\x82 in the sky and said", "The caf\xc3\xa9 was"};
    enum { N = 4, MAXT = 60 };
    static int32_t want[N][MAXT];
    static char want_text[N][16384];
    int n_want[N];
    for (int k = 0; k < N; k++) {
        n_want[k] = run_msmoe_run_text(prompts[k], MAXT, want[k], MAXT, want_text[k], sizeof want_text[k]);
        cr_assert_gt(n_want[k], 0);
        msm_client_gen g;
        text_gen_init(&g, prompts[k], MAXT);
        cr_assert_eq(msm_client_send_generate(c, (uint64_t)(10 + k), &g, &err), 0, "%s", err.msg);
    }
    static stream s[N];
    streams_read(c, 10, s, N);
    for (int k = 0; k < N; k++) {
        cr_assert_gt(s[k].finish, 0, "'%s': %s", prompts[k], s[k].msg);
        cr_assert_eq(s[k].n, n_want[k], "'%s': %d tokens, msmoe-run %d", prompts[k], s[k].n, n_want[k]);
        cr_assert_arr_eq(s[k].ids, want[k], (size_t)n_want[k] * sizeof(int32_t), "'%s': ids differ", prompts[k]);
        cr_assert_eq(s[k].n_text, s[k].n, "'%s': every chunk carries text", prompts[k]);
        cr_assert_eq(s[k].bad_text, 0, "'%s': a chunk split a UTF-8 character", prompts[k]);
        /* The stream continues the prompt, so it keeps the leading space of a first word that a
         * stand-alone decode (msmoe-run --text) strips; otherwise the texts are equal. */
        const char *got = s[k].text;
        if (got[0] == ' ' && want_text[k][0] != ' ')
            got++;
        cr_assert_str_eq(got, want_text[k], "'%s': streamed text differs from msmoe-run --text", prompts[k]);
        fprintf(stderr, "text: '%s' -> '%.60s...'\n", prompts[k], s[k].text);
    }
    cr_assert_str_eq(s[0].text, want_text[0]);
    cr_assert(!strncmp(s[0].text, ", there was a little girl named Lily.", 37), "%s", s[0].text);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon_text, stop_string_ends_the_generation, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    msm_client_gen g;
    stream full, cut;
    text_gen_init(&g, "Once upon a time", 80);
    generate(c, 1, &g, &full);
    cr_assert_eq(full.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH);
    const char *at = strstr(full.text, "Lily");
    cr_assert_not_null(at, "%s", full.text);
    static const char *const stops[] = {"Lily", "zebra"};
    g.stop_strings = stops;
    g.n_stop_strings = 2;
    generate(c, 2, &g, &cut);
    cr_assert_eq(cut.finish, MSMOE__V1__FINISH_REASON__FINISH_STOP, "finish %d: %s", cut.finish, cut.msg);
    cr_assert_eq(cut.text_len, (size_t)(at - full.text));
    cr_assert(!strncmp(cut.text, full.text, cut.text_len), "'%s' is not a prefix of '%s'", cut.text, full.text);
    cr_assert_lt(cut.n, 20, "generation stopped at the stop string (%d tokens)", cut.n);
    cr_assert_eq(cut.completion_tokens, cut.n);
    cr_assert_arr_eq(cut.ids, full.ids, (size_t)cut.n * sizeof(int32_t));
    fprintf(stderr, "stop 'Lily': '%s' (%d tokens, finish stop)\n", cut.text, cut.n);
    /* A stop string that spans tokens ("girl named"). */
    static const char *const stops2[] = {"girl named"};
    g.stop_strings = stops2;
    g.n_stop_strings = 1;
    generate(c, 3, &g, &cut);
    cr_assert_eq(cut.finish, MSMOE__V1__FINISH_REASON__FINISH_STOP);
    cr_assert_str_eq(cut.text, ", there was a little ");
    /* ids prompts get text too, and stop strings work on them. */
    static const int32_t once[] = {1, 403, 407, 261, 378};
    ids_gen_init(&g, once, 5, 80);
    g.temperature = 0;
    g.set_temperature = true;
    g.stop_strings = stops;
    g.n_stop_strings = 1;
    generate(c, 4, &g, &cut);
    cr_assert_eq(cut.finish, MSMOE__V1__FINISH_REASON__FINISH_STOP);
    cr_assert_eq(cut.text_len, (size_t)(at - full.text));
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

static Msmoe__V1__ServerFrame *call_tokenize(msm_client *c, uint64_t rid, const char *text, bool add_special) {
    msm_err err;
    cr_assert_eq(msm_client_send_tokenize(c, rid, text, add_special, false, &err), 0, "%s", err.msg);
    return recv_reply(c, rid);
}

static Msmoe__V1__ServerFrame *call_detokenize(msm_client *c, uint64_t rid, const int32_t *ids, size_t n, bool skip) {
    msm_err err;
    cr_assert_eq(msm_client_send_detokenize(c, rid, ids, n, skip, &err), 0, "%s", err.msg);
    return recv_reply(c, rid);
}

Test(daemon_text, tokenize_detokenize_round_trip_and_errors, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    static const char *texts[] = {"Once upon a time", "Lily saw a \xf0\x9f\x99\x82 and a caf\xc3\xa9.\nThe end.",
                                  "\xe4\xbd\xa0\xe5\xa5\xbd"};
    for (int k = 0; k < 3; k++) {
        /* The same ids as the tokenizer's command line (which adds no BOS). */
        char cmd[1024], out[4096];
        snprintf(cmd, sizeof cmd, "printf '%%s' '%s' | %s --tokenizer %s/tokenizer.json --encode", texts[k],
                 env_or("MSMOE_RUN", "build/tools/msmoe-run"), env_or("MSMOE_MODEL", "models/stories260k-moe"));
        cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", cmd);
        Msmoe__V1__ServerFrame *f = call_tokenize(c, (uint64_t)(20 + k), texts[k], false);
        cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_TOKENIZE);
        char got[4096] = "";
        for (size_t i = 0; i < f->tokenize->n_ids; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? "," : "", f->tokenize->ids[i]);
        strcat(got, "\n");
        cr_assert_str_eq(got, out, "'%s'", texts[k]);
        Msmoe__V1__ServerFrame *g = call_detokenize(c, (uint64_t)(30 + k), f->tokenize->ids, f->tokenize->n_ids, true);
        cr_assert_eq(g->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_DETOKENIZE);
        cr_assert_str_eq(g->detokenize->text, texts[k], "round trip");
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        msmoe__v1__server_frame__free_unpacked(g, NULL);
    }
    /* add_special adds <s> (id 1); skip_special leaves it out of the text. */
    Msmoe__V1__ServerFrame *f = call_tokenize(c, 40, "Once upon a time", true);
    static const int32_t once[] = {1, 403, 407, 261, 378};
    cr_assert_eq(f->tokenize->n_ids, 5);
    cr_assert_arr_eq(f->tokenize->ids, once, sizeof once);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    f = call_detokenize(c, 41, once, 5, false);
    cr_assert(strstr(f->detokenize->text, "<s>") && strstr(f->detokenize->text, "Once upon a time"), "%s",
              f->detokenize->text);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    /* Errors: ids out of range, invalid UTF-8; the connection stays usable. */
    static const int32_t bad[] = {403, 512};
    f = call_detokenize(c, 42, bad, 2, false);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_ERROR);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    cr_assert(strstr(f->error->message, "detokenize.ids[1] = 512"), "%s", f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    static const int32_t neg[] = {-7};
    f = call_detokenize(c, 43, neg, 1, false);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    f = call_tokenize(c, 44, "caf\xc3", true);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_ERROR);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    cr_assert(strstr(f->error->message, "tokenize.text"), "%s", f->error->message);
    fprintf(stderr, "tokenize of invalid UTF-8 -> %s\n", f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    f = call_detokenize(c, 45, NULL, 0, false);
    cr_assert_str_eq(f->detokenize->text, "");
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon_text, text_prompt_errors, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    msm_err err;
    msm_client_gen g;
    /* Longer than the context (512 tokens). */
    static char longtext[8192];
    for (int i = 0; i < 600; i++)
        strcat(longtext, "cat ");
    text_gen_init(&g, longtext, 8);
    cr_assert_eq(msm_client_send_generate(c, 1, &g, &err), 0);
    expect_code(c, 1, MSMOE__V1__CODE__INVALID_ARGUMENT, "prompt_text longer than the context");
    /* Neither prompt; both prompts. */
    msm_client_gen_init(&g);
    cr_assert_eq(msm_client_send_generate(c, 2, &g, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    cr_assert(strstr(f->error->message, "prompt_ids") && strstr(f->error->message, "prompt_text"), "%s",
              f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    static const int32_t ids[] = {1, 2};
    text_gen_init(&g, "Once", 8);
    g.prompt = ids;
    g.n_prompt = 2;
    cr_assert_eq(msm_client_send_generate(c, 3, &g, &err), 0);
    f = recv_frame(c);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    cr_assert(strstr(f->error->message, "prompt_ids or prompt_text, not both"), "%s", f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    /* Invalid UTF-8 in the prompt and in a stop string. */
    text_gen_init(&g, "Once \xff", 8);
    cr_assert_eq(msm_client_send_generate(c, 4, &g, &err), 0);
    expect_code(c, 4, MSMOE__V1__CODE__INVALID_ARGUMENT, "prompt_text with invalid UTF-8");
    static const char *const badstop[] = {"\xc3"};
    text_gen_init(&g, "Once", 8);
    g.stop_strings = badstop;
    g.n_stop_strings = 1;
    cr_assert_eq(msm_client_send_generate(c, 5, &g, &err), 0);
    expect_code(c, 5, MSMOE__V1__CODE__INVALID_ARGUMENT, "stop string with invalid UTF-8");
    /* "<s>" in the text stays text unless parse_special is asked for. */
    stream a, b;
    text_gen_init(&g, "<s>Once", 1);
    generate(c, 6, &g, &a);
    g.parse_special = true;
    generate(c, 7, &g, &b);
    cr_assert_gt(a.finish, 0);
    cr_assert_gt(b.finish, 0);
    msm_client_free(c);
    still_serving(&d);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* A model directory without tokenizer.json: a warning, ids only. A broken tokenizer.json: a clear
 * start-up error. */
Test(daemon_text, missing_and_broken_tokenizer, .timeout = 120) {
    need_model();
    char dir[] = "/tmp/msmoed-notok.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char model[1100], path[1200], cmd[4096];
    const char *src = env_or("MSMOE_MODEL", "models/stories260k-moe");
    if (src[0] == '/')
        snprintf(model, sizeof model, "%s", src);
    else {
        char cwd[512];
        cr_assert_not_null(getcwd(cwd, sizeof cwd));
        snprintf(model, sizeof model, "%s/%s", cwd, src);
    }
    static const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char from[1200];
        snprintf(from, sizeof from, "%s/%s", model, files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        cr_assert_eq(symlink(from, path), 0);
    }
    static char set_model[1200];
    snprintf(set_model, sizeof set_model, "engine.model=%s", dir);
    const char *sets[] = {set_model, NULL};
    daemon_proc d;
    start_daemon(&d, sets, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    msm_err err;
    cr_assert_eq(msm_client_send_simple(c, 1, MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert(f->model_info->has_has_tokenizer && !f->model_info->has_tokenizer);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    msm_client_gen g;
    text_gen_init(&g, "Once upon a time", 4);
    cr_assert_eq(msm_client_send_generate(c, 2, &g, &err), 0);
    expect_code(c, 2, MSMOE__V1__CODE__FAILED_PRECONDITION, "prompt_text without a tokenizer");
    cr_assert_eq(msm_client_send_tokenize(c, 3, "Once", true, false, &err), 0);
    expect_code(c, 3, MSMOE__V1__CODE__FAILED_PRECONDITION, "tokenize without a tokenizer");
    stream s;
    static const int32_t once[] = {1, 403, 407, 261, 378};
    ids_gen_init(&g, once, 5, 8);
    generate(c, 4, &g, &s);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "ids still work");
    cr_assert_eq(s.n_text, 0, "no text without a tokenizer");
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);

    /* Broken: not JSON. The daemon exits 1 and says which file and why. */
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *fp = fopen(path, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": [", fp);
    fclose(fp);
    snprintf(cmd, sizeof cmd, "%s --set server.socket=%s/s.sock --set engine.model=%s 2>&1",
             env_or("MSMOED", "build/daemon/msmoed"), dir, dir);
    char out[8192];
    int rc = sh(cmd, out, sizeof out);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, out);
    cr_assert(strstr(out, "cannot load the tokenizer") && strstr(out, path), "%s", out);
    fprintf(stderr, "broken tokenizer.json -> %s", out);
    /* engine.tokenizer = none: text off even with a tokenizer.json; a named missing file fails. */
    snprintf(cmd, sizeof cmd, "%s --set engine.model=%s --set engine.tokenizer=/nonexistent/tok.json --check-config 2>&1",
             env_or("MSMOED", "build/daemon/msmoed"), dir);
    cr_assert_eq(sh(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "/nonexistent/tok.json"), "%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(daemon_text, cli_text_commands, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    const char *cli = env_or("MSMOE", "build/tools/msmoe");
    char cmd[2048], out[65536], want_text[16384];
    int32_t want[64];
    run_msmoe_run_text("Once upon a time", 40, want, 64, want_text, sizeof want_text);
    /* A positional text prompt: the prompt, then the streamed continuation. */
    snprintf(cmd, sizeof cmd, "%s --socket %s generate 'Once upon a time' --max-tokens 40 --temperature 0 2>/dev/null",
             cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    char expect[16500];
    snprintf(expect, sizeof expect, "Once upon a time%s\n", want_text);
    cr_assert_str_eq(out, expect);
    snprintf(cmd, sizeof cmd, "%s --socket %s generate 'Once upon a time' --max-tokens 40 --temperature 0 --no-echo "
             "--stop Lily 2>&1", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert(!strncmp(out, ", there was a little girl named \n[finish: stop", 46), "%s", out);
    /* --ids: text too (no echo of ids); --print-ids: ids. */
    snprintf(cmd, sizeof cmd, "%s --socket %s generate --ids 1,403,407,261,378 --max-tokens 40 --temperature 0 2>/dev/null",
             cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    snprintf(expect, sizeof expect, "%s\n", want_text);
    cr_assert_str_eq(out, expect);
    snprintf(cmd, sizeof cmd, "%s --socket %s tokenize 'Once upon a time'", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "1,403,407,261,378\n");
    snprintf(cmd, sizeof cmd, "%s --socket %s tokenize --no-add-special 'Once upon a time'", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "403,407,261,378\n");
    snprintf(cmd, sizeof cmd, "%s --socket %s detokenize 1,403,407,261,378 --skip-special", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "Once upon a time\n");
    snprintf(cmd, sizeof cmd, "%s --socket %s detokenize 1,9999 2>&1", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 1);
    cr_assert(strstr(out, "INVALID_ARGUMENT") && strstr(out, "9999"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s --socket %s generate 2>&1", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 2, "no prompt: usage error");
    cr_assert_eq(stop_daemon(&d), 0);
}
