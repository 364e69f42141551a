/* msm_tokenizer: a Hugging Face tokenizer.json tokenizer (encode, decode, streaming decode).
 *
 * Two model families are supported, both of model.type "BPE":
 *   - byte-level BPE (GPT-2, Qwen2/3, DeepSeek-V3, Llama-3): pre_tokenizer ByteLevel, possibly in
 *     a Sequence after Split(regex) steps; decoder ByteLevel;
 *   - SentencePiece-style BPE with byte fallback (Llama-2, Mixtral, llama2.c models): "<0xNN>"
 *     byte pieces, normalizer Prepend("▁")/Replace(" ", "▁") or pre_tokenizer Metaspace; decoder
 *     Replace/ByteFallback/Fuse/Strip or Metaspace.
 * added_tokens (special tokens such as <|endoftext|> or <s>) are matched in the input text before
 * the model runs; the post_processor's tokens (TemplateProcessing's BOS) are added only when the
 * caller asks for them. The regexes of the pre-tokenizer run on PCRE2 with UTF and UCP.
 *
 * Normalizers: NFC (Qwen2/2.5/3), NFD, NFKC, NFKD and Lowercase through libunistring, Prepend and
 * Replace, and any Sequence of them. As in Hugging Face, the normalizer runs on each stretch of
 * text between matched added tokens, so decode(encode(text)) gives the normalised text.
 *
 * Not supported (refused at load with -ENOTSUP and a message): the other normalizers (Strip,
 * StripAccents, BertNormalizer, Precompiled, ...), WordPiece/Unigram/WordLevel models, BPE with
 * continuing_subword_prefix or end_of_word_suffix, and decoders other than ByteLevel, Metaspace,
 * Replace, ByteFallback, Fuse and Strip.
 *
 * A loaded tokenizer is immutable: encode and decode may run concurrently from many threads on
 * one msm_tokenizer. Input text must be valid UTF-8 (-EINVAL otherwise, with the byte offset). */
#ifndef MSM_TOKENIZER_H
#define MSM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_err.h"

typedef struct msm_tokenizer msm_tokenizer;

/* Loads a tokenizer.json file. On success *ret_tok owns everything (free with msm_tokenizer_free). */
int msm_tokenizer_load(const char *path, msm_tokenizer **ret_tok, msm_err *err);

/* Same, from a JSON text of len bytes; source names it in error messages (a path, "<memory>"). */
int msm_tokenizer_load_buffer(const char *json, size_t len, const char *source,
                              msm_tokenizer **ret_tok, msm_err *err);

/* Accepts NULL and half-built tokenizers. */
void msm_tokenizer_free(msm_tokenizer *tok);

/* Number of ids: one more than the largest id of the vocabulary and the added tokens. */
int msm_tokenizer_vocab_size(const msm_tokenizer *tok);

/* Flags of msm_tokenizer_encode_flags. */
enum {
    MSM_TOK_ADD_SPECIAL = 1u << 0,   /* add the post_processor's tokens (BOS for Llama) */
    MSM_TOK_PARSE_SPECIAL = 1u << 1, /* match special added tokens (<|endoftext|>) in the text */
};

/* Encodes len bytes of UTF-8 text into token ids; *ret_ids is malloc'ed (free() it; it may be
 * NULL when *ret_n is 0). Special tokens written in the text are parsed, as Hugging Face does by
 * default; add_special adds the post_processor's tokens. */
int msm_tokenizer_encode(const msm_tokenizer *tok, const char *text, size_t len, bool add_special,
                         int32_t **ret_ids, size_t *ret_n, msm_err *err);

/* Same with MSM_TOK_* flags. Without MSM_TOK_PARSE_SPECIAL a literal "<|endoftext|>" in user
 * text is encoded as ordinary text (what a server wants for untrusted prompts); non-special added
 * tokens are always matched. */
int msm_tokenizer_encode_flags(const msm_tokenizer *tok, const char *text, size_t len,
                               unsigned flags, int32_t **ret_ids, size_t *ret_n, msm_err *err);

/* Decodes ids into UTF-8 text; *ret_text is malloc'ed and NUL-terminated (*ret_len excludes the
 * NUL). Invalid UTF-8 produced by byte tokens becomes U+FFFD. An id outside [0, vocab_size) is
 * -EINVAL, with the id and the vocabulary size in the message. */
int msm_tokenizer_decode(const msm_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                         char **ret_text, size_t *ret_len, msm_err *err);

/* The id of a vocabulary piece or added token written as in tokenizer.json ("Ġthe", "<s>",
 * "<0x0A>"), or -ENOENT. */
int msm_tokenizer_token_id(const msm_tokenizer *tok, const char *piece);

/* The piece of an id as written in tokenizer.json, or NULL for an id out of range. */
const char *msm_tokenizer_token_piece(const msm_tokenizer *tok, int32_t id);

/* Whether id is a special added token (<s>, </s>, <|endoftext|>). */
bool msm_tokenizer_is_special(const msm_tokenizer *tok, int32_t id);

/* The post_processor's BOS (the first token it adds in front), or -ENOENT when it adds none. */
int msm_tokenizer_bos_id(const msm_tokenizer *tok);

/* ---- Streaming detokenizer ----
 * Turns ids into text one at a time, as a model generates them: each push emits only complete
 * UTF-8 sequences and holds back an incomplete trailing sequence (a character split over byte
 * tokens) until the next push; flush emits what is held (as U+FFFD, since it can no longer
 * complete). Concatenating every push and the flush gives exactly msm_tokenizer_decode(). */

enum {
    MSM_DETOK_SKIP_SPECIAL = 1u << 0, /* emit nothing for special tokens (<s>, </s>) */
    MSM_DETOK_CONTINUE = 1u << 1,     /* the text continues one already shown (a prompt): do not
                                         strip the SentencePiece leading space of the first token */
};

/* Embedded state (init/done, no heap). */
typedef struct msm_detok {
    const msm_tokenizer *tok;
    unsigned flags;
    int strip_left;      /* leading spaces still to strip (SentencePiece "Strip" decoder) */
    uint8_t pending[4];  /* bytes of an incomplete UTF-8 sequence */
    int n_pending;
} msm_detok;

void msm_detok_init(msm_detok *d, const msm_tokenizer *tok, unsigned flags);

/* The largest number of bytes one push or flush can write: give at least this capacity. */
size_t msm_detok_max_out(const msm_tokenizer *tok);

/* Decodes one id and writes the complete UTF-8 text now available into out (not NUL-terminated);
 * *ret_len may be 0. -ENOSPC (state unchanged) when cap is below what this token needs,
 * -EINVAL for an id out of range. */
int msm_detok_push(msm_detok *d, int32_t id, char *out, size_t cap, size_t *ret_len, msm_err *err);

/* Emits the held-back bytes (as U+FFFD) and resets the held state. */
int msm_detok_flush(msm_detok *d, char *out, size_t cap, size_t *ret_len);

#endif
