/* msm_textstream: the text of one generated sequence, streamed, with its stop strings.
 *
 * The scheduler feeds it each token a sequence generates and hands out what it returns as the
 * text deltas of that sequence's events. Deltas are never half a UTF-8 character (the streaming
 * detokenizer holds an incomplete one back). The text continues the prompt: the SentencePiece
 * space of its first word is kept, and special tokens add nothing.
 *
 * Stop strings match on the text: the token that completes one ends the generation, and the text
 * is cut just before the match (the first match to end wins: where a character-by-character
 * generation would have stopped; among those ending there, the earliest start). Text that could
 * still be the start of a stop string is held back until the next token tells; the final delta
 * carries everything still held, the detokenizer's flush included, except after a stop-string
 * match. NUL characters are dropped (the API's strings cannot carry them), and an id the tokenizer
 * does not know (a model vocabulary padded past the tokenizer's) adds no text.
 *
 * Single-threaded: it belongs to whichever thread runs the scheduler. */
#ifndef MSM_TEXTSTREAM_H
#define MSM_TEXTSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_tokenizer.h"

typedef struct msm_textstream {
    msm_detok detok;
    char *const *stops;       /* [n_stops] NUL-terminated UTF-8 (borrowed) */
    int n_stops;
    char *text;               /* [len] the text so far, NUL-terminated (owned; NULL before any) */
    size_t len, cap;
    size_t sent;              /* bytes of text handed out already */
    bool cut;                 /* a stop string matched: text ends where it began */
} msm_textstream;

/* tok and stops are borrowed and must outlive the stream. Allocates nothing. */
void msm_textstream_init(msm_textstream *ts, const msm_tokenizer *tok, char *const *stops, int n_stops);
/* Frees the text; accepts a zeroed, never initialised stream. */
void msm_textstream_done(msm_textstream *ts);

/* Appends the text token t adds. Returns 1 when that completed a stop string (the text is then
 * cut back to the match's start; push nothing more), 0 otherwise, -ENOMEM. */
int msm_textstream_push(msm_textstream *ts, int32_t t);

/* The sequence ended: flushes the detokenizer (an incomplete character becomes U+FFFD) unless a
 * stop string cut the text. 0 or -ENOMEM. */
int msm_textstream_finish(msm_textstream *ts);

/* The text ready to hand out: *ret_len bytes at the returned pointer (valid until the next push
 * or finish), those not handed out yet, except, unless final, a tail that could still begin a stop
 * string. Mark what was handed out with msm_textstream_sent. */
const char *msm_textstream_ready(const msm_textstream *ts, bool final, size_t *ret_len);
void msm_textstream_sent(msm_textstream *ts, size_t n);

#endif
