/* Unit tests of the text streams (daemon/textstream.c) with the embedded model's tokenizer: the
 * deltas add up to the streaming decode and never split a character, stop strings cut the text at
 * the first match to complete, a possible stop-string start is held back until it is known, and
 * the end of a sequence releases what was held. (The scheduler's use of them, with events,
 * preemption and cancels, is tested in test_sched.c.) */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <unistr.h>

#include "msm_textstream.h"
#include "testutil.h"

/* What a consumer of the stream saw: the concatenated deltas, and how they went. */
typedef struct seen {
    char text[4096];
    size_t len;
    int deltas;
    int bad_deltas;           /* deltas that were not whole UTF-8 characters */
    int stopped_at;           /* index of the token whose push completed a stop string; -1: none */
} seen;

static void take(msm_textstream *ts, bool final, seen *s) {
    size_t n;
    const char *d = msm_textstream_ready(ts, final, &n);
    if (u8_check((const uint8_t *)d, n))
        s->bad_deltas++;
    cr_assert_lt(s->len + n, sizeof s->text);
    memcpy(s->text + s->len, d, n);
    s->len += n;
    s->text[s->len] = 0;
    s->deltas++;
    msm_textstream_sent(ts, n);
}

/* Streams ids as a scheduler would: a delta after every token, the final one at the end (or at
 * the token that completed a stop string). */
static void stream(const int32_t *ids, int n, char *const *stops, int n_stops, seen *s) {
    msm_textstream ts;
    memset(s, 0, sizeof *s);
    s->stopped_at = -1;
    msm_textstream_init(&ts, test_stories_tokenizer(), stops, n_stops);
    for (int i = 0; i < n && s->stopped_at < 0; i++) {
        int rc = msm_textstream_push(&ts, ids[i]);
        cr_assert_geq(rc, 0);
        if (rc == 1)
            s->stopped_at = i;
        else
            take(&ts, false, s);
    }
    cr_assert_eq(msm_textstream_finish(&ts), 0);
    take(&ts, true, s);
    msm_textstream_done(&ts);
}

Test(textstream, deltas_add_up_to_the_streaming_decode_of_the_ids) {
    /* Ids over the whole vocabulary: byte tokens included, so characters are split over tokens
     * and invalid sequences occur. */
    int32_t ids[300];
    uint32_t x = 12345;
    for (int i = 0; i < 300; i++) {
        x = x * 1103515245u + 12345u;
        ids[i] = (int32_t)((x >> 8) % 512);
    }
    seen s;
    stream(ids, 300, NULL, 0, &s);
    char want[4096];
    test_streamed_text(ids, 300, want, sizeof want);
    cr_assert_str_eq(s.text, want);
    cr_assert_eq(s.bad_deltas, 0, "a delta split a character");
    cr_assert_eq(s.deltas, 301);
}

Test(textstream, a_character_split_over_byte_tokens_is_never_split_in_a_delta) {
    /* "né 🙂 ok": the emoji is four byte tokens, é is a byte pair or a piece. */
    static const char text[] = " n\xc3\xa9 \xf0\x9f\x99\x82 ok";
    int32_t ids[64];
    int n = test_script_of(text, ids, 64);
    seen s;
    stream(ids, n, NULL, 0, &s);
    cr_assert_eq(s.bad_deltas, 0);
    cr_assert_str_eq(s.text, text);
}

Test(textstream, ids_the_tokenizer_does_not_know_add_no_text) {
    int32_t ids[] = {403, 600, 407, 100000};
    seen s;
    stream(ids, 4, NULL, 0, &s);
    char want[64];
    int32_t known[] = {403, 407};
    test_streamed_text(known, 2, want, sizeof want);
    cr_assert_str_eq(s.text, want);
}

Test(textstream, stop_string_stops_and_is_cut_from_the_text) {
    int32_t ids[128];
    int n = test_script_of(" Tom ran home.\nQ: what next? Tom slept.", ids, 128);
    char *stops[] = {"Q:"};
    seen s;
    stream(ids, n, stops, 1, &s);
    cr_assert_str_eq(s.text, " Tom ran home.\n", "the text ends before the stop string");
    cr_assert_geq(s.stopped_at, 0);
    /* The push that reported the stop is the token that completed "Q:". */
    char *dec;
    size_t dl;
    cr_assert_eq(msm_tokenizer_decode(test_stories_tokenizer(), ids, (size_t)s.stopped_at + 1, true, &dec, &dl, NULL), 0);
    cr_assert(strstr(dec, "Q:") && !strstr(dec, "what"), "ids up to the stop decode to '%s'", dec);
    free(dec);
}

Test(textstream, held_back_prefix_of_a_stop_string_is_released_when_it_does_not_match) {
    static const char text[] = " The dog was big. The dog was happy.";
    int32_t ids[128];
    int n = test_script_of(text, ids, 128);
    char *stops[] = {"The cat", "dog was sad"};
    msm_textstream ts;
    msm_textstream_init(&ts, test_stories_tokenizer(), stops, 2);
    seen s = {.stopped_at = -1};
    /* Token by token: a delta never ends inside "The" or "dog" while a stop string could follow. */
    for (int i = 0; i < n; i++) {
        cr_assert_eq(msm_textstream_push(&ts, ids[i]), 0);
        take(&ts, false, &s);
        if (s.len >= 3)
            cr_assert(strcmp(s.text + s.len - 3, "The") != 0 && strcmp(s.text + s.len - 3, "dog") != 0,
                      "a possible stop-string start was sent: '%s'", s.text);
    }
    cr_assert_eq(msm_textstream_finish(&ts), 0);
    take(&ts, true, &s);
    cr_assert_str_eq(s.text, text, "everything held back came out at the end");
    msm_textstream_done(&ts);
}

Test(textstream, first_stop_string_to_complete_wins) {
    int32_t ids[128];
    int n = test_script_of(" one two three four", ids, 128);
    /* "two three" starts earlier but "o t" (in "two three") completes first. */
    char *stops[] = {"two three", "o t"};
    seen s;
    stream(ids, n, stops, 2, &s);
    cr_assert_geq(s.stopped_at, 0);
    cr_assert_str_eq(s.text, " one tw");
}

Test(textstream, the_end_releases_the_held_text) {
    int32_t ids[128];
    int n = test_script_of(" a b c d e f g h", ids, 128);
    cr_assert_geq(n, 2);
    char *stops[] = {"b x"};
    msm_textstream ts;
    msm_textstream_init(&ts, test_stories_tokenizer(), stops, 1);
    seen s = {.stopped_at = -1};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(msm_textstream_push(&ts, ids[i]), 0);
        take(&ts, false, &s);
    }
    cr_assert_str_eq(s.text, " a ", "'b' could start 'b x': held back");
    cr_assert_eq(msm_textstream_finish(&ts), 0);
    take(&ts, true, &s);
    cr_assert_str_eq(s.text, " a b", "the sequence ended (a cancel, a length limit): 'b' comes out");
    msm_textstream_done(&ts);
}
