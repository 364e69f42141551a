/* msm_eval: the pieces of msmoe-eval that do not talk to the daemon, so they can be tested alone.
 *
 *   - GSM8K: the reference answer of a test record ("... #### 1,234"), the answer a model wrote
 *     ("... The answer is $1,234."), and the normal form both are compared in;
 *   - MMLU: a small RFC 4180 CSV reader (quoted fields with commas, "" and newlines), the 5-shot
 *     prompt in the format of Hendrycks et al., and the answer letter chosen from top-n logprobs;
 *   - the JSON report (json-c) and `compare` of two reports (agreement, first differing token).
 *
 * Functions return 0 or a negative errno and, where a user must read why, fill an msm_err. */
#ifndef MSM_EVAL_H
#define MSM_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <json-c/json.h>

#include "msm_err.h"
#include "msm_tokenizer.h"
#include "msmoe.pb-c.h"

/* ---- Numbers and GSM8K answers ---- */

/* Normal form of a number as written by a person or a model: drops "$", "+" and thousands
 * separators, leading zeros, trailing decimal zeros and a bare trailing ".", turns "-0" into "0"
 * ("$1,234.50" -> "1234.5", "-007.000" -> "-7"). Writes at most cap bytes with the NUL.
 * -EINVAL when s is not a number in that sense, -ENOSPC when cap is too small. */
int msm_eval_number_normalize(const char *s, char *out, size_t cap);

/* The answer of a GSM8K output: the first number after the last "The answer is" (any case), or,
 * when that phrase is absent or has no number after it, the last number of the text. Numbers may
 * carry a sign, a "$" and thousands separators (a comma followed by exactly three digits); a
 * sentence-final "." is not a decimal point. Writes the normal form; -ENOENT when the text holds
 * no number. */
int msm_eval_gsm8k_extract(const char *text, char *out, size_t cap);

/* The reference of a GSM8K test record: the number after the last "####", in normal form.
 * -EINVAL when there is no "####" or no number after it. */
int msm_eval_gsm8k_reference(const char *answer, char *out, size_t cap);

/* The k-shot chain-of-thought prompt of lm-evaluation-harness's gsm8k-cot task: each exemplar as
 * "Q: {question}\nA: {target}\n\n", then "Q: {question}\nA:". *ret is malloc'ed. */
int msm_eval_gsm8k_prompt(const char *const *shot_q, const char *const *shot_a, int n_shots,
                          const char *question, char **ret);

/* Cuts text at the earliest occurrence of any stop string (the stop string removed, as the
 * harness does); returns the new length (len when no stop string occurs). */
size_t msm_eval_cut_at_stop(char *text, size_t len, const char *const *stops, int n_stops);

/* The number of leading ids to keep so generation ends with the token that completed the first
 * stop string in the decoded text (what the daemon's stop strings do), or n when none occurs.
 * For outputs generated without server-side stop strings (--prompt-ids). */
int msm_eval_ids_until_stop(const msm_tokenizer *tok, const int32_t *ids, int n, const char *const *stops,
                            int n_stops, int *ret_keep, msm_err *err);

/* ---- CSV ---- */

/* One parsed CSV file: rows of fields, every string malloc'ed and NUL-terminated. */
typedef struct msm_eval_csv {
    int n_rows;
    int *n_fields;   /* [n_rows] */
    char ***fields;  /* [n_rows][n_fields[r]] */
} msm_eval_csv;

/* Parses RFC 4180 text: fields separated by ",", records by "\n" or "\r\n"; a field that starts
 * with '"' runs to the next lone '"' and may hold ",", "\n" and '""' (a quote). A leading UTF-8
 * BOM and a missing final newline are accepted; blank lines are skipped. An unterminated quoted
 * field, or text after a closing quote, is -EINVAL with the line number (source names the file). */
int msm_eval_csv_parse(const char *buf, size_t len, const char *source, msm_eval_csv *ret, msm_err *err);
void msm_eval_csv_done(msm_eval_csv *csv);

/* ---- MMLU ---- */

/* One multiple-choice question (pointers borrowed from the CSV). */
typedef struct msm_eval_mcq {
    const char *question;
    const char *choices[4];
    char answer;    /* 'A'..'D' */
} msm_eval_mcq;

/* Converts a CSV row "question,A,B,C,D,answer". -EINVAL (with row and source) when it does not
 * have six fields or the answer is not one of A-D. */
int msm_eval_mcq_from_row(char **fields, int n_fields, const char *source, int row,
                          msm_eval_mcq *ret, msm_err *err);

/* The prompt of the original MMLU evaluation (hendrycks/test evaluate.py):
 *   "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
 * then per exemplar "{question}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer: {X}\n\n", then the
 * question the same way ending in "Answer:". The subject's underscores become spaces. */
int msm_eval_mmlu_prompt(const char *subject, const msm_eval_mcq *shots, int n_shots,
                         const msm_eval_mcq *q, char **ret);

/* The answer letter from the top-n logprobs of the token after "Answer:": the letter whose
 * token (letter_ids[i] is the id of " A", " B", ...) has the highest logprob; letters missing
 * from the top-n count as -inf. Writes the four logprobs (-INFINITY when missing) into ret_lp
 * when it is not NULL and returns 0..3, or -ENOENT when no letter is in the top-n. Ties go to
 * the earlier letter. */
int msm_eval_mmlu_pick(const Msmoe__V1__TokenLogprob *lp, const int32_t letter_ids[4], float ret_lp[4]);

/* The ids of " A", " B", " C", " D" as the model sees them after the prompt's "Answer:": the
 * token that encoding "Answer: X" adds to the encoding of "Answer:". *ret_exact is true when that
 * is one token for every letter (every real MoE tokenizer: GPT-2, Qwen, Llama/Mixtral, DeepSeek).
 * When a letter adds more than one token (a small SentencePiece vocabulary without "▁A" splits
 * it into "▁" and "A"), the last added token, the one carrying the letter, stands for it and
 * *ret_exact is false: an approximation, since the model's next token is then often a bare "▁".
 * -ENOTSUP (with source, the tokenizer's name, in the message) when two letters share a token,
 * since next-token logprobs cannot then tell them apart. */
int msm_eval_mmlu_letter_ids(const msm_tokenizer *tok, const char *source, int32_t ret[4], bool *ret_exact,
                             msm_err *err);

/* ---- Items, report, compare ---- */

/* One evaluated item: the prompt, what the daemon returned, and the verdict. */
typedef struct msm_eval_item {
    char id[96];              /* "gsm8k/test/17", "mmlu/anatomy/3": stable across runs */
    char subject[64];         /* "" for GSM8K */
    char *prompt;             /* owned */
    char reference[64];       /* normal-form number, or "A".."D" */
    /* Results. */
    char *output;             /* owned, the generated text */
    size_t output_len, output_cap;
    int32_t *ids;             /* owned, the generated token ids */
    int n_ids, cap_ids;
    char answer[64];          /* extracted answer; "" when none */
    bool has_answer;
    bool correct;
    bool has_letter_lp;
    float letter_lp[4];       /* MMLU: logprobs of " A".." D" (-inf: not in the top-n) */
    int finish_reason;        /* Msmoe__V1__FinishReason */
    uint32_t prompt_tokens, completion_tokens;
    char *error;              /* owned; the daemon's refusal, or NULL */
    bool done;
} msm_eval_item;

void msm_eval_item_done(msm_eval_item *it);
/* Appends generated text / ids (grows the buffers). */
int msm_eval_item_add_text(msm_eval_item *it, const char *s, size_t n);
int msm_eval_item_add_ids(msm_eval_item *it, const int32_t *ids, size_t n);

/* 64-bit FNV-1a of the prompt as 16 hex digits: identifies the prompt, not a secret. */
void msm_eval_prompt_hash(const char *prompt, char out[17]);

/* The scalar fields of any protobuf message as a JSON object (ModelInfo in reports). */
json_object *msm_eval_proto_to_json(const ProtobufCMessage *m);

/* The report of a run: {"task", "model_info", "settings", "summary", "items": [...]}. model_info
 * and settings are taken over (may be NULL). Summary: n, correct, accuracy, errors; for MMLU also
 * per-subject accuracy and macro (mean over subjects) / micro (over items) accuracy. */
json_object *msm_eval_report_new(const char *task, const msm_eval_item *items, int n,
                                 json_object *model_info, json_object *settings, double elapsed_s);

/* Summary numbers of a report's items (also used by compare). */
typedef struct msm_eval_summary {
    int n, correct, errors;
    double accuracy;          /* micro */
    double macro;             /* mean over subjects; equals accuracy when there are none */
    int n_subjects;
} msm_eval_summary;

/* Summary of a report's "items" array. */
void msm_eval_summarize(json_object *items, msm_eval_summary *ret);

/* Index of the first position where a and b differ, counting a length difference; -1 when equal. */
int msm_eval_first_diff(const int32_t *a, int na, const int32_t *b, int nb);

/* Compare of two reports, item by item (matched by id). */
typedef struct msm_eval_compare_result {
    msm_eval_summary a, b;   /* over each report's own items */
    int n_common;            /* items present in both */
    int n_agree;             /* same extracted answer (both none counts as the same) */
    int n_identical;         /* same output token ids (where both have ids) */
    int n_with_ids;          /* common items where both give token ids */
    int only_a, only_b;      /* items in one report only */
    int prompt_mismatch;     /* common items whose prompt hashes differ */
    double agreement;        /* n_agree / n_common (0 when nothing is common) */
} msm_eval_compare_result;

/* Checks the shape of a loaded report (-EINVAL with what is wrong). */
int msm_eval_report_check(json_object *r, const char *source, msm_err *err);

/* Compares two checked reports. When out is not NULL, prints the accuracy of each, the
 * agreement, and every differing item with both outputs and the first differing token index
 * (at most max_print items; < 0: all). -EINVAL when the reports are of different tasks. */
int msm_eval_compare(json_object *a, json_object *b, const char *name_a, const char *name_b,
                     FILE *out, int max_print, msm_eval_compare_result *ret, msm_err *err);

#endif
