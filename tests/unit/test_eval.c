/* Tests of msm_eval (tools/eval/): GSM8K answer extraction on tricky outputs and reference
 * parsing, the prompts of both tasks, the CSV reader's edge cases, MMLU letter ids and letter
 * scoring on a fake daemon reply (a packed and unpacked ServerFrame), the report and compare of
 * two small reports (agreement, first differing token). Data: data/eval/ and the tokenizers in
 * models/ and tests/data/ (read from the project root, meson's test workdir). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "msm_eval.h"

/* ---- GSM8K answer extraction ---- */

/* Inline strings: Criterion runs each parameter in a new process, where pointers would dangle. */
typedef struct extract_case {
    char text[96];
    char want[24]; /* "": no number */
} extract_case;

static const extract_case extract_cases[] = {
    {"There are 15 trees. 21 - 15 = 6. The answer is 6.", "6"},
    {"The answer is $1,234.", "1234"},
    {"So she pays 3 * $2.50 = $7.50. The answer is $7.50.", "7.5"},
    {"He has 1,000,000 dollars. The answer is 1,000,000", "1000000"},
    {"The temperature drops to -5 degrees. The answer is -5.", "-5"},
    {"10-3 = 7 so the answer is 7", "7"},                       /* case, and "10-3" is no -3 */
    {"She had 10 apples, gave 3, then 2. In total 5 remain.", "5"}, /* fallback: last number */
    {"The answer is 12. Wait, actually 3 + 4 = 7. The answer is 7.", "7"}, /* the last phrase */
    {"The answer is 5.0", "5"},
    {"The answer is 0.50.", "0.5"},
    {"The answer is 007.", "7"},
    {"The answer is -0.", "0"},
    {"Result: 3,4 and 5", "5"},                                 /* "3,4" is no thousands group */
    {"The answer is 18 dollars and 3 cents.", "18"},            /* first number after the phrase */
    {"The answer is unclear. I guess 42", "42"},                /* first number after the phrase */
    {"The answer is unclear.", ""},
    {"", ""},
    {"No numbers here at all.", ""},
    {"It costs \xe2\x88\x92" "3 degrees. The answer is \xe2\x88\x92" "3.", "-3"}, /* U+2212 */
    {"Total = 12,345.67 dollars", "12345.67"},
    {"x2 plus 4 is the answer", "4"},
    {"The answer is: 1,5", "1"},
};

ParameterizedTestParameters(gsm8k, extract) {
    return cr_make_param_array(extract_case, extract_cases, sizeof extract_cases / sizeof *extract_cases);
}

ParameterizedTest(const extract_case *c, gsm8k, extract) {
    char out[64];
    int rc = msm_eval_gsm8k_extract(c->text, out, sizeof out);
    if (!c->want[0]) {
        cr_assert_eq(rc, -ENOENT, "\"%s\": expected no number, got %d (%s)", c->text, rc, rc ? "" : out);
        return;
    }
    cr_assert_eq(rc, 0, "\"%s\": rc %d", c->text, rc);
    cr_assert_str_eq(out, c->want, "\"%s\"", c->text);
}

Test(gsm8k, normalize_forms) {
    const char *in[] = {"$1,234.50", "-007.000", "+5", "-$3", "$-3", " 42 ", ".5", "3.", "0"};
    const char *want[] = {"1234.5", "-7", "5", "-3", "-3", "42", "0.5", "3", "0"};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) {
        char out[32];
        cr_assert_eq(msm_eval_number_normalize(in[i], out, sizeof out), 0, "%s", in[i]);
        cr_assert_str_eq(out, want[i], "%s", in[i]);
    }
    char out[4];
    cr_assert_eq(msm_eval_number_normalize("abc", out, sizeof out), -EINVAL);
    cr_assert_eq(msm_eval_number_normalize("12x", out, sizeof out), -EINVAL);
    cr_assert_eq(msm_eval_number_normalize("", out, sizeof out), -EINVAL);
    cr_assert_eq(msm_eval_number_normalize("12345", out, sizeof out), -ENOSPC);
}

Test(gsm8k, reference_of_test_records) {
    char out[64];
    cr_assert_eq(msm_eval_gsm8k_reference("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs.\n#### 18", out,
                                          sizeof out), 0);
    cr_assert_str_eq(out, "18");
    cr_assert_eq(msm_eval_gsm8k_reference("... so 1,000 + 200\n#### 1,200", out, sizeof out), 0);
    cr_assert_str_eq(out, "1200");
    cr_assert_eq(msm_eval_gsm8k_reference("x\n#### -3", out, sizeof out), 0);
    cr_assert_str_eq(out, "-3");
    cr_assert_eq(msm_eval_gsm8k_reference("no marker 5", out, sizeof out), -EINVAL);
    cr_assert_eq(msm_eval_gsm8k_reference("#### none", out, sizeof out), -EINVAL);
}

/* Every record of the shipped test split has a reference, and it is an integer. */
Test(gsm8k, shipped_test_split_parses) {
    FILE *f = fopen("data/eval/gsm8k/test.jsonl", "r");
    cr_assert_not_null(f, "data/eval/gsm8k/test.jsonl");
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        json_object *o = json_tokener_parse(line), *a;
        cr_assert_not_null(o);
        cr_assert(json_object_object_get_ex(o, "answer", &a));
        char out[64];
        cr_assert_eq(msm_eval_gsm8k_reference(json_object_get_string(a), out, sizeof out), 0, "line %d", n + 1);
        cr_assert_null(strchr(out, '.'), "line %d: %s", n + 1, out);
        json_object_put(o);
        n++;
    }
    free(line);
    fclose(f);
    cr_assert_eq(n, 1319);
}

Test(gsm8k, prompt_is_harness_cot_format) {
    const char *q[] = {"Q one?", "Q two?"}, *a[] = {"So 1. The answer is 1.", "The answer is 2."};
    char *p = NULL;
    cr_assert_eq(msm_eval_gsm8k_prompt(q, a, 2, "Real?", &p), 0);
    cr_assert_str_eq(p, "Q: Q one?\nA: So 1. The answer is 1.\n\nQ: Q two?\nA: The answer is 2.\n\nQ: Real?\nA:");
    free(p);
    cr_assert_eq(msm_eval_gsm8k_prompt(NULL, NULL, 0, "Only?", &p), 0);
    cr_assert_str_eq(p, "Q: Only?\nA:");
    free(p);
}

Test(gsm8k, stop_strings_cut_the_output) {
    const char *stops[] = {"Q:", "</s>"};
    char t1[] = "So 5. The answer is 5.\n\nQ: next question";
    size_t n = msm_eval_cut_at_stop(t1, strlen(t1), stops, 2);
    cr_assert_str_eq(t1, "So 5. The answer is 5.\n\n");
    cr_assert_eq(n, strlen(t1));
    char t2[] = "no stop here";
    cr_assert_eq(msm_eval_cut_at_stop(t2, strlen(t2), stops, 2), strlen("no stop here"));
    char t3[] = "a</s>b Q: c";
    msm_eval_cut_at_stop(t3, strlen(t3), stops, 2);
    cr_assert_str_eq(t3, "a");
}

/* With --prompt-ids the output ids end with the token that completes a stop string, as the
 * daemon's stop strings would end them. */
Test(gsm8k, ids_end_at_the_token_completing_a_stop_string) {
    msm_tokenizer *tok = NULL;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_load("tests/data/tokenizer/gpt2/tokenizer.json", &tok, &err), 0, "%s", err.msg);
    const char *text = " The answer is 6.\n\nQ: There are";
    int32_t *ids = NULL;
    size_t n = 0;
    cr_assert_eq(msm_tokenizer_encode(tok, text, strlen(text), false, &ids, &n, &err), 0, "%s", err.msg);
    const char *stops[] = {"Q:"};
    int keep = -1;
    cr_assert_eq(msm_eval_ids_until_stop(tok, ids, (int)n, stops, 1, &keep, &err), 0, "%s", err.msg);
    char *dec = NULL;
    size_t len = 0;
    cr_assert_eq(msm_tokenizer_decode(tok, ids, (size_t)keep, true, &dec, &len, &err), 0);
    cr_assert(len >= 2 && strcmp(dec + len - 2, "Q:") == 0, "kept \"%s\"", dec);
    free(dec);
    cr_assert_eq(msm_tokenizer_decode(tok, ids, (size_t)keep - 1, true, &dec, &len, &err), 0);
    cr_assert_null(strstr(dec, "Q:"), "one token less has no stop: \"%s\"", dec);
    free(dec);
    const char *none[] = {"zzz"};
    cr_assert_eq(msm_eval_ids_until_stop(tok, ids, (int)n, none, 1, &keep, &err), 0);
    cr_assert_eq(keep, (int)n);
    free(ids);
    msm_tokenizer_free(tok);
}

/* ---- CSV ---- */

static msm_eval_csv parse_ok(const char *text) {
    msm_eval_csv csv;
    msm_err err = {{0}};
    int rc = msm_eval_csv_parse(text, strlen(text), "<test>", &csv, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    return csv;
}

Test(csv, quoted_fields_with_commas_quotes_and_newlines) {
    msm_eval_csv c = parse_ok("plain,\"a, b\",\"say \"\"hi\"\"\",\"line1\nline2\",\"\",x\n"
                              "second,row\n");
    cr_assert_eq(c.n_rows, 2);
    cr_assert_eq(c.n_fields[0], 6);
    cr_assert_str_eq(c.fields[0][0], "plain");
    cr_assert_str_eq(c.fields[0][1], "a, b");
    cr_assert_str_eq(c.fields[0][2], "say \"hi\"");
    cr_assert_str_eq(c.fields[0][3], "line1\nline2");
    cr_assert_str_eq(c.fields[0][4], "");
    cr_assert_str_eq(c.fields[0][5], "x");
    cr_assert_eq(c.n_fields[1], 2);
    cr_assert_str_eq(c.fields[1][1], "row");
    msm_eval_csv_done(&c);
}

Test(csv, crlf_bom_blank_lines_no_final_newline_empty_fields) {
    msm_eval_csv c = parse_ok("\xef\xbb\xbf" "a,b\r\n\r\n\n\"q\"\r\n,,\nlast,");
    cr_assert_eq(c.n_rows, 4);
    cr_assert_str_eq(c.fields[0][0], "a");
    cr_assert_str_eq(c.fields[0][1], "b");
    cr_assert_eq(c.n_fields[1], 1);
    cr_assert_str_eq(c.fields[1][0], "q");
    cr_assert_eq(c.n_fields[2], 3);
    cr_assert_str_eq(c.fields[2][2], "");
    cr_assert_eq(c.n_fields[3], 2);
    cr_assert_str_eq(c.fields[3][0], "last");
    cr_assert_str_eq(c.fields[3][1], "");
    msm_eval_csv_done(&c);
}

Test(csv, leading_spaces_and_lone_cr_are_kept) {
    msm_eval_csv c = parse_ok(" a , b\rc\n");
    cr_assert_eq(c.n_fields[0], 2);
    cr_assert_str_eq(c.fields[0][0], " a ");
    cr_assert_str_eq(c.fields[0][1], " b\rc");
    msm_eval_csv_done(&c);
}

Test(csv, malformed_input_names_the_line) {
    msm_eval_csv c;
    msm_err err = {{0}};
    const char *open = "a,b\n\"never closed,\nmore\n";
    cr_assert_eq(msm_eval_csv_parse(open, strlen(open), "f.csv", &c, &err), -EINVAL);
    cr_assert(strstr(err.msg, "f.csv:2") && strstr(err.msg, "never closed"), "%s", err.msg);
    const char *after = "a\n\"x\"y,z\n";
    cr_assert_eq(msm_eval_csv_parse(after, strlen(after), "g.csv", &c, &err), -EINVAL);
    cr_assert(strstr(err.msg, "g.csv:2") && strstr(err.msg, "after the closing quote"), "%s", err.msg);
}

/* Every shipped MMLU file parses into rows of six fields with a letter answer, and the row counts
 * are those of subjects.tsv (the CSV reader agrees with Python's csv module that wrote them). */
Test(csv, shipped_mmlu_files_parse_with_the_published_counts) {
    FILE *f = fopen("data/eval/mmlu/subjects.tsv", "r");
    cr_assert_not_null(f);
    char name[128];
    int n_test, n_dev, subjects = 0, total = 0;
    char header[64];
    cr_assert_not_null(fgets(header, sizeof header, f));
    while (fscanf(f, "%127s %d %d", name, &n_test, &n_dev) == 3) {
        const char *split[2] = {"test", "dev"};
        int want[2] = {n_test, n_dev};
        for (int s = 0; s < 2; s++) {
            char path[256];
            snprintf(path, sizeof path, "data/eval/mmlu/%s/%s_%s.csv", split[s], name, split[s]);
            FILE *g = fopen(path, "rb");
            cr_assert_not_null(g, "%s", path);
            fseek(g, 0, SEEK_END);
            long len = ftell(g);
            rewind(g);
            char *buf = malloc((size_t)len + 1);
            cr_assert_eq(fread(buf, 1, (size_t)len, g), (size_t)len);
            fclose(g);
            msm_eval_csv c;
            msm_err err = {{0}};
            cr_assert_eq(msm_eval_csv_parse(buf, (size_t)len, path, &c, &err), 0, "%s", err.msg);
            cr_assert_eq(c.n_rows, want[s], "%s: %d rows, want %d", path, c.n_rows, want[s]);
            for (int r = 0; r < c.n_rows; r++) {
                msm_eval_mcq q;
                cr_assert_eq(msm_eval_mcq_from_row(c.fields[r], c.n_fields[r], path, r, &q, &err), 0, "%s", err.msg);
            }
            if (s == 0)
                total += c.n_rows;
            msm_eval_csv_done(&c);
            free(buf);
        }
        subjects++;
    }
    fclose(f);
    cr_assert_eq(subjects, 57);
    cr_assert_eq(total, 14042);
}

Test(mmlu, bad_rows_are_refused) {
    msm_eval_mcq q;
    msm_err err = {{0}};
    char *five[] = {"q", "a", "b", "c", "d"};
    cr_assert_eq(msm_eval_mcq_from_row(five, 5, "x.csv", 3, &q, &err), -EINVAL);
    cr_assert(strstr(err.msg, "x.csv: row 4 has 5 fields"), "%s", err.msg);
    char *bad[] = {"q", "a", "b", "c", "d", "E"};
    cr_assert_eq(msm_eval_mcq_from_row(bad, 6, "x.csv", 0, &q, &err), -EINVAL);
    char *good[] = {"q", "a", "b", "c", "d", "C"};
    cr_assert_eq(msm_eval_mcq_from_row(good, 6, "x.csv", 0, &q, &err), 0);
    cr_assert_eq(q.answer, 'C');
    cr_assert_str_eq(q.choices[3], "d");
}

/* ---- MMLU prompt ---- */

Test(mmlu, prompt_is_the_hendrycks_format) {
    msm_eval_mcq shots[2] = {
        {.question = "Find 1+1.", .choices = {"1", "2", "3", "4"}, .answer = 'B'},
        {.question = "Which is a prime?", .choices = {"4", "6", "7", "8"}, .answer = 'C'},
    };
    msm_eval_mcq q = {.question = "Is x, \"quoted\"\nreal?", .choices = {"yes", "no", "maybe", "all of the above"}, .answer = 'A'};
    char *p = NULL;
    cr_assert_eq(msm_eval_mmlu_prompt("abstract_algebra", shots, 2, &q, &p), 0);
    cr_assert_str_eq(p,
                     "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
                     "Find 1+1.\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n"
                     "Which is a prime?\nA. 4\nB. 6\nC. 7\nD. 8\nAnswer: C\n\n"
                     "Is x, \"quoted\"\nreal?\nA. yes\nB. no\nC. maybe\nD. all of the above\nAnswer:");
    free(p);
    cr_assert_eq(msm_eval_mmlu_prompt("high_school_us_history", NULL, 0, &q, &p), 0);
    cr_assert(strncmp(p, "The following are multiple choice questions (with answers) about high school us history.\n\nIs x",
                      strlen("The following are multiple choice questions (with answers) about high school us history.\n\nIs x")) == 0,
              "%s", p);
    free(p);
}

/* ---- MMLU letters ---- */

Test(mmlu, letter_ids_of_gpt2_and_the_embedded_model) {
    msm_tokenizer *tok = NULL;
    msm_err err = {{0}};
    int32_t ids[4];
    bool exact = false;
    cr_assert_eq(msm_tokenizer_load("tests/data/tokenizer/gpt2/tokenizer.json", &tok, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_eval_mmlu_letter_ids(tok, "gpt2", ids, &exact, &err), 0, "%s", err.msg);
    /* GPT-2's " A", " B", " C", " D", each one token. */
    cr_assert(exact);
    cr_assert(ids[0] == 317 && ids[1] == 347 && ids[2] == 327 && ids[3] == 360, "%d %d %d %d", ids[0], ids[1],
              ids[2], ids[3]);
    msm_tokenizer_free(tok);
    tok = NULL;
    /* tok512 has "▁B" but no "▁A": " A" is "▁" + "A", so the letter-carrying token stands in. */
    cr_assert_eq(msm_tokenizer_load("models/stories260k-moe/tokenizer.json", &tok, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_eval_mmlu_letter_ids(tok, "stories260k", ids, &exact, &err), 0, "%s", err.msg);
    cr_assert_not(exact);
    for (int k = 0; k < 4; k++) {
        const char *piece = msm_tokenizer_token_piece(tok, ids[k]);
        char want[2] = {(char)('A' + k), 0};
        cr_assert(piece && strstr(piece, want), "letter %c: piece %s", 'A' + k, piece);
    }
    msm_tokenizer_free(tok);
}

/* A fake daemon reply: a ServerFrame with one chunk whose logprobs hold a top-n list, packed and
 * unpacked the way the client receives it. */
static Msmoe__V1__ServerFrame *fake_reply(const int32_t *ids, const float *lps, int n) {
    Msmoe__V1__ServerFrame f = MSMOE__V1__SERVER_FRAME__INIT;
    Msmoe__V1__GenerateChunk c = MSMOE__V1__GENERATE_CHUNK__INIT;
    Msmoe__V1__TokenLogprob tl = MSMOE__V1__TOKEN_LOGPROB__INIT;
    Msmoe__V1__TopLogprob tops[32], *ptops[32];
    for (int i = 0; i < n; i++) {
        tops[i] = (Msmoe__V1__TopLogprob)MSMOE__V1__TOP_LOGPROB__INIT;
        tops[i].has_token_id = tops[i].has_logprob = 1;
        tops[i].token_id = ids[i];
        tops[i].logprob = lps[i];
        ptops[i] = &tops[i];
    }
    int32_t chosen = ids[0];
    tl.has_token_id = tl.has_logprob = 1;
    tl.token_id = chosen;
    tl.logprob = lps[0];
    tl.n_top = (size_t)n;
    tl.top = ptops;
    Msmoe__V1__TokenLogprob *ptl = &tl;
    c.n_token_ids = 1;
    c.token_ids = &chosen;
    c.n_logprobs = 1;
    c.logprobs = &ptl;
    c.has_finish_reason = 1;
    c.finish_reason = MSMOE__V1__FINISH_REASON__FINISH_LENGTH;
    f.has_request_id = 1;
    f.request_id = 7;
    f.reply_case = MSMOE__V1__SERVER_FRAME__REPLY_CHUNK;
    f.chunk = &c;
    uint8_t buf[4096];
    size_t len = msmoe__v1__server_frame__pack(&f, buf);
    return msmoe__v1__server_frame__unpack(NULL, len, buf);
}

Test(mmlu, letter_scoring_from_a_fake_reply) {
    const int32_t letters[4] = {317, 347, 327, 360};
    /* The model's top token is not a letter; among the letters " C" is the most likely. */
    const int32_t ids[] = {198, 360, 327, 11, 317};
    const float lps[] = {-0.5f, -2.5f, -1.25f, -3.0f, -4.0f};
    Msmoe__V1__ServerFrame *f = fake_reply(ids, lps, 5);
    cr_assert_not_null(f);
    float lp[4];
    int k = msm_eval_mmlu_pick(f->chunk->logprobs[0], letters, lp);
    cr_assert_eq(k, 2);
    cr_assert_float_eq(lp[0], -4.0f, 1e-6);
    cr_assert(isinf(lp[1]) && lp[1] < 0, " B is not in the top-n: -inf");
    cr_assert_float_eq(lp[2], -1.25f, 1e-6);
    cr_assert_float_eq(lp[3], -2.5f, 1e-6);
    msmoe__v1__server_frame__free_unpacked(f, NULL);

    /* No letter in the top-n: no answer. */
    const int32_t none[] = {1, 2, 3};
    const float nlp[] = {-0.1f, -2.0f, -3.0f};
    f = fake_reply(none, nlp, 3);
    cr_assert_eq(msm_eval_mmlu_pick(f->chunk->logprobs[0], letters, lp), -ENOENT);
    cr_assert(isinf(lp[0]) && isinf(lp[3]));
    msmoe__v1__server_frame__free_unpacked(f, NULL);

    /* A tie goes to the earlier letter. */
    const int32_t tie[] = {360, 347};
    const float tlp[] = {-1.0f, -1.0f};
    f = fake_reply(tie, tlp, 2);
    cr_assert_eq(msm_eval_mmlu_pick(f->chunk->logprobs[0], letters, NULL), 1);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
}

/* ---- Report and compare ---- */

static void fill(msm_eval_item *it, const char *id, const char *subject, const char *out, const int32_t *ids,
                 int n, const char *answer, const char *ref) {
    memset(it, 0, sizeof *it);
    snprintf(it->id, sizeof it->id, "%s", id);
    snprintf(it->subject, sizeof it->subject, "%s", subject);
    it->prompt = strdup(id);
    cr_assert_eq(msm_eval_item_add_text(it, out, strlen(out)), 0);
    cr_assert_eq(msm_eval_item_add_ids(it, ids, (size_t)n), 0);
    if (answer) {
        snprintf(it->answer, sizeof it->answer, "%s", answer);
        it->has_answer = true;
    }
    snprintf(it->reference, sizeof it->reference, "%s", ref);
    it->correct = answer && strcmp(answer, ref) == 0;
    it->finish_reason = MSMOE__V1__FINISH_REASON__FINISH_STOP;
}

Test(report, fields_and_subject_accuracy) {
    msm_eval_item it[3];
    const int32_t ids[] = {5, 6};
    fill(&it[0], "mmlu/a/0", "a", " A", ids, 1, "A", "A");
    fill(&it[1], "mmlu/a/1", "a", " B", ids, 1, "B", "C");
    fill(&it[2], "mmlu/b/0", "b", " D", ids, 1, "D", "D");
    it[2].has_letter_lp = true;
    it[2].letter_lp[0] = -INFINITY;
    it[2].letter_lp[1] = it[2].letter_lp[2] = -3;
    it[2].letter_lp[3] = -0.5f;
    json_object *mi = json_object_new_object();
    json_object_object_add(mi, "backend", json_object_new_string("cpu"));
    json_object *r = msm_eval_report_new("mmlu", it, 3, mi, NULL, 2.0);
    msm_err err = {{0}};
    cr_assert_eq(msm_eval_report_check(r, "r", &err), 0, "%s", err.msg);
    json_object *s, *v, *items, *x, *lp;
    cr_assert(json_object_object_get_ex(r, "summary", &s));
    cr_assert(json_object_object_get_ex(s, "micro_accuracy", &v));
    cr_assert_float_eq(json_object_get_double(v), 2.0 / 3, 1e-9);
    cr_assert(json_object_object_get_ex(s, "macro_accuracy", &v));
    cr_assert_float_eq(json_object_get_double(v), (0.5 + 1.0) / 2, 1e-9);
    cr_assert(json_object_object_get_ex(r, "items", &items));
    x = json_object_array_get_idx(items, 2);
    const char *keys[] = {"id", "prompt_hash", "output", "output_ids", "answer", "reference", "correct",
                          "finish_reason", "letter_logprobs"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
        cr_assert(json_object_object_get_ex(x, keys[k], &v) && v, "missing %s", keys[k]);
    cr_assert(json_object_object_get_ex(x, "letter_logprobs", &lp));
    cr_assert(json_object_object_get_ex(lp, "A", &v) && v == NULL, "-inf is written as null");
    cr_assert(json_object_object_get_ex(x, "finish_reason", &v));
    cr_assert_str_eq(json_object_get_string(v), "stop");
    json_object_put(r);
    for (int i = 0; i < 3; i++)
        msm_eval_item_done(&it[i]);
}

Test(compare, first_diff) {
    const int32_t a[] = {1, 2, 3}, b[] = {1, 2, 4}, c[] = {1, 2};
    cr_assert_eq(msm_eval_first_diff(a, 3, a, 3), -1);
    cr_assert_eq(msm_eval_first_diff(a, 3, b, 3), 2);
    cr_assert_eq(msm_eval_first_diff(a, 3, c, 2), 2);
    cr_assert_eq(msm_eval_first_diff(a, 0, c, 0), -1);
    cr_assert_eq(msm_eval_first_diff(a, 3, b, 0), 0);
}

/* Two small report files written and read back: one answer differs, one output differs in its
 * tokens but not its answer, one item exists only in A. */
Test(compare, two_report_files) {
    msm_eval_item a[4], b[3];
    const int32_t t1[] = {10, 11, 12}, t2[] = {10, 11, 99, 13}, t3[] = {7};
    fill(&a[0], "gsm8k/test/0", "", "The answer is 5.", t1, 3, "5", "5");
    fill(&a[1], "gsm8k/test/1", "", "The answer is 6.", t1, 3, "6", "7");
    fill(&a[2], "gsm8k/test/2", "", "so 8. The answer is 8.", t1, 3, "8", "8");
    fill(&a[3], "gsm8k/test/3", "", "no number", t3, 1, NULL, "1");
    fill(&b[0], "gsm8k/test/2", "", "thus 8. The answer is 8.", t2, 4, "8", "8"); /* other order */
    fill(&b[1], "gsm8k/test/0", "", "The answer is 5.", t1, 3, "5", "5");
    fill(&b[2], "gsm8k/test/1", "", "The answer is 7.", t2, 4, "7", "7");
    char pa[] = "/tmp/test_eval_a_XXXXXX", pb[] = "/tmp/test_eval_b_XXXXXX";
    int fa = mkstemp(pa), fb = mkstemp(pb);
    cr_assert(fa >= 0 && fb >= 0);
    json_object *ra = msm_eval_report_new("gsm8k", a, 4, NULL, NULL, 1), *rb = msm_eval_report_new("gsm8k", b, 3, NULL, NULL, 1);
    cr_assert_eq(json_object_to_fd(fa, ra, JSON_C_TO_STRING_PRETTY), 0);
    cr_assert_eq(json_object_to_fd(fb, rb, JSON_C_TO_STRING_PRETTY), 0);
    json_object_put(ra);
    json_object_put(rb);
    ra = json_object_from_file(pa);
    rb = json_object_from_file(pb);
    msm_err err = {{0}};
    cr_assert_eq(msm_eval_report_check(ra, pa, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_eval_report_check(rb, pb, &err), 0, "%s", err.msg);

    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    msm_eval_compare_result res;
    cr_assert_eq(msm_eval_compare(ra, rb, "A.json", "B.json", out, -1, &res, &err), 0, "%s", err.msg);
    fclose(out);
    cr_assert_eq(res.n_common, 3);
    cr_assert_eq(res.n_agree, 2);
    cr_assert_eq(res.only_a, 1);
    cr_assert_eq(res.only_b, 0);
    cr_assert_eq(res.n_with_ids, 3);
    cr_assert_eq(res.n_identical, 1);
    cr_assert_float_eq(res.agreement, 2.0 / 3, 1e-9);
    cr_assert_eq(res.a.correct, 2);
    cr_assert_eq(res.b.correct, 3);
    cr_assert(strstr(text, "gsm8k/test/1"), "%s", text);
    cr_assert(strstr(text, "first differing token: index 2 (A 12, B 99)"), "%s", text);
    cr_assert(strstr(text, "The answer is 6.") && strstr(text, "The answer is 7."), "both outputs: %s", text);
    cr_assert_null(strstr(text, "  gsm8k/test/2 "), "same answer is not listed: %s", text);
    cr_assert(strstr(text, "agreement: 66.67% (2/3"), "%s", text);
    free(text);

    /* A report against itself agrees fully; different tasks are refused. */
    cr_assert_eq(msm_eval_compare(ra, ra, "A", "A", NULL, 0, &res, &err), 0);
    cr_assert_float_eq(res.agreement, 1.0, 1e-12);
    cr_assert_eq(res.n_identical, 4);
    json_object_object_add(rb, "task", json_object_new_string("mmlu"));
    cr_assert_eq(msm_eval_compare(ra, rb, "A", "B", NULL, 0, &res, &err), -EINVAL);
    cr_assert(strstr(err.msg, "mmlu"), "%s", err.msg);
    json_object_put(ra);
    json_object_put(rb);
    unlink(pa);
    unlink(pb);
    for (int i = 0; i < 4; i++)
        msm_eval_item_done(&a[i]);
    for (int i = 0; i < 3; i++)
        msm_eval_item_done(&b[i]);
}

Test(compare, malformed_reports_are_refused) {
    msm_err err = {{0}};
    json_object *r = json_tokener_parse("{\"task\":\"gsm8k\",\"items\":[{\"id\":\"x\"},{\"id\":\"x\"}]}");
    cr_assert_eq(msm_eval_report_check(r, "dup.json", &err), -EINVAL);
    cr_assert(strstr(err.msg, "appears twice"), "%s", err.msg);
    json_object_put(r);
    r = json_tokener_parse("{\"items\":[]}");
    cr_assert_eq(msm_eval_report_check(r, "t.json", &err), -EINVAL);
    cr_assert(strstr(err.msg, "task"), "%s", err.msg);
    json_object_put(r);
    r = json_tokener_parse("{\"task\":\"mmlu\",\"items\":[{\"id\":\"y\",\"output_ids\":[1,\"a\"]}]}");
    cr_assert_eq(msm_eval_report_check(r, "i.json", &err), -EINVAL);
    json_object_put(r);
}

Test(report, prompt_hash_is_stable) {
    char h[17], g[17];
    msm_eval_prompt_hash("", h);
    cr_assert_str_eq(h, "cbf29ce484222325");
    msm_eval_prompt_hash("a", g);
    cr_assert_str_eq(g, "af63dc4c8601ec8c");
}
