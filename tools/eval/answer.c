/* GSM8K answers (numbers the way people write them, the model's final answer, the reference's
 * "#### N") and the prompts of both tasks. See msm_eval.h. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msm_eval.h"

#define UMINUS "\xe2\x88\x92" /* U+2212 MINUS SIGN, which some models write */

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

int msm_eval_number_normalize(const char *s, char *out, size_t cap) {
    while (isspace((unsigned char)*s))
        s++;
    bool neg = false, dollar = false;
    for (;;) { /* sign and "$" in either order: "-$5", "$-5" */
        if ((*s == '-' || *s == '+') && !neg) {
            neg = *s == '-';
            s++;
        } else if (strncmp(s, UMINUS, 3) == 0 && !neg) {
            neg = true;
            s += 3;
        } else if (*s == '$' && !dollar) {
            dollar = true;
            s++;
        } else {
            break;
        }
    }
    char ip[64], fp[64];
    size_t ni = 0, nf = 0;
    for (; is_digit(*s) || (*s == ',' && ni > 0 && is_digit(s[1])); s++)
        if (*s != ',') {
            if (ni + 1 >= sizeof ip)
                return -EINVAL;
            ip[ni++] = *s;
        }
    if (*s == '.') {
        s++;
        for (; is_digit(*s); s++) {
            if (nf + 1 >= sizeof fp)
                return -EINVAL;
            fp[nf++] = *s;
        }
    }
    while (isspace((unsigned char)*s))
        s++;
    if (*s || (ni == 0 && nf == 0))
        return -EINVAL;
    /* Leading zeros of the integer part, trailing zeros of the fraction. */
    size_t a = 0;
    while (a + 1 < ni && ip[a] == '0')
        a++;
    while (nf > 0 && fp[nf - 1] == '0')
        nf--;
    bool zero = (ni == 0 || (ni - a == 1 && ip[a] == '0')) && nf == 0;
    size_t need = (neg && !zero) + (ni ? ni - a : 1) + (nf ? 1 + nf : 0) + 1;
    if (need > cap)
        return -ENOSPC;
    char *o = out;
    if (neg && !zero)
        *o++ = '-';
    if (ni) {
        memcpy(o, ip + a, ni - a);
        o += ni - a;
    } else {
        *o++ = '0';
    }
    if (nf) {
        *o++ = '.';
        memcpy(o, fp, nf);
        o += nf;
    }
    *o = 0;
    return 0;
}

/* Finds the next number at or after s: sets [*ret_b, *ret_e) to its text (sign and "$"
 * included) and returns true, or false when there is none. */
static bool next_number(const char *s, const char *text, const char **ret_b, const char **ret_e) {
    for (const char *p = s; *p; p++) {
        if (!is_digit(*p))
            continue;
        const char *b = p;
        if (b > text && b[-1] == '$')
            b--;
        /* A minus sign counts when it does not stand between two operands ("10-3"). */
        const char *m = NULL;
        if (b > text && b[-1] == '-')
            m = b - 1;
        else if (b - text >= 3 && strncmp(b - 3, UMINUS, 3) == 0)
            m = b - 3;
        if (m && (m == text || !(isalnum((unsigned char)m[-1]) || m[-1] == ')' || m[-1] == '.')))
            b = m;
        const char *e = p;
        while (is_digit(*e))
            e++;
        /* Thousands separators: a comma then exactly three digits. */
        while (e[0] == ',' && is_digit(e[1]) && is_digit(e[2]) && is_digit(e[3]) && !is_digit(e[4]))
            e += 4;
        if (e[0] == '.' && is_digit(e[1])) {
            e++;
            while (is_digit(*e))
                e++;
        }
        *ret_b = b;
        *ret_e = e;
        return true;
    }
    return false;
}

static int normalize_span(const char *b, const char *e, char *out, size_t cap) {
    char tmp[128];
    size_t n = (size_t)(e - b);
    if (n >= sizeof tmp)
        return -EINVAL;
    memcpy(tmp, b, n);
    tmp[n] = 0;
    return msm_eval_number_normalize(tmp, out, cap);
}

/* The last occurrence of needle in hay, ignoring ASCII case; NULL when absent. */
static const char *last_casestr(const char *hay, const char *needle) {
    const char *last = NULL;
    for (const char *p = hay; (p = strcasestr(p, needle)); p++)
        last = p;
    return last;
}

int msm_eval_gsm8k_extract(const char *text, char *out, size_t cap) {
    const char *b, *e;
    const char *phrase = last_casestr(text, "the answer is");
    if (phrase && next_number(phrase + strlen("the answer is"), text, &b, &e))
        return normalize_span(b, e, out, cap);
    const char *lb = NULL, *le = NULL;
    for (const char *p = text; next_number(p, text, &b, &e); p = e) {
        lb = b;
        le = e;
    }
    if (!lb)
        return -ENOENT;
    return normalize_span(lb, le, out, cap);
}

int msm_eval_gsm8k_reference(const char *answer, char *out, size_t cap) {
    const char *h = NULL;
    for (const char *p = answer; (p = strstr(p, "####")); p++)
        h = p;
    if (!h)
        return -EINVAL;
    h += 4;
    if (msm_eval_number_normalize(h, out, cap) == 0)
        return 0;
    const char *b, *e;
    if (!next_number(h, answer, &b, &e))
        return -EINVAL;
    return normalize_span(b, e, out, cap);
}

/* A growing string. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->oom)
        return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + k + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

static int sb_finish(sbuf *b, char **ret) {
    if (b->oom || !b->p) {
        free(b->p);
        return -ENOMEM;
    }
    *ret = b->p;
    return 0;
}

int msm_eval_gsm8k_prompt(const char *const *shot_q, const char *const *shot_a, int n_shots,
                          const char *question, char **ret) {
    sbuf b = {0};
    for (int i = 0; i < n_shots; i++) {
        sb_add(&b, "Q: ");
        sb_add(&b, shot_q[i]);
        sb_add(&b, "\nA: ");
        sb_add(&b, shot_a[i]);
        sb_add(&b, "\n\n");
    }
    sb_add(&b, "Q: ");
    sb_add(&b, question);
    sb_add(&b, "\nA:");
    return sb_finish(&b, ret);
}

int msm_eval_mmlu_prompt(const char *subject, const msm_eval_mcq *shots, int n_shots,
                         const msm_eval_mcq *q, char **ret) {
    sbuf b = {0};
    char subj[128];
    snprintf(subj, sizeof subj, "%s", subject);
    for (char *p = subj; *p; p++)
        if (*p == '_')
            *p = ' ';
    sb_add(&b, "The following are multiple choice questions (with answers) about ");
    sb_add(&b, subj);
    sb_add(&b, ".\n\n");
    for (int i = 0; i <= n_shots; i++) {
        const msm_eval_mcq *m = i < n_shots ? &shots[i] : q;
        sb_add(&b, m->question);
        for (int k = 0; k < 4; k++) {
            char lab[8];
            snprintf(lab, sizeof lab, "\n%c. ", 'A' + k);
            sb_add(&b, lab);
            sb_add(&b, m->choices[k]);
        }
        sb_add(&b, "\nAnswer:");
        if (i < n_shots) {
            char ans[8];
            snprintf(ans, sizeof ans, " %c\n\n", m->answer);
            sb_add(&b, ans);
        }
    }
    return sb_finish(&b, ret);
}

size_t msm_eval_cut_at_stop(char *text, size_t len, const char *const *stops, int n_stops) {
    size_t cut = len;
    for (int i = 0; i < n_stops; i++) {
        const char *p = memmem(text, len, stops[i], strlen(stops[i]));
        if (p && (size_t)(p - text) < cut)
            cut = (size_t)(p - text);
    }
    text[cut] = 0;
    return cut;
}

int msm_eval_ids_until_stop(const msm_tokenizer *tok, const int32_t *ids, int n, const char *const *stops,
                            int n_stops, int *ret_keep, msm_err *err) {
    msm_detok d;
    msm_detok_init(&d, tok, MSM_DETOK_SKIP_SPECIAL | MSM_DETOK_CONTINUE);
    size_t step = msm_detok_max_out(tok), len = 0;
    char *text = malloc(step * (size_t)(n > 0 ? n : 1) + 1);
    if (!text)
        return msm_err_set(err, -ENOMEM, "out of memory");
    int keep = n;
    for (int i = 0; i < n; i++) {
        size_t k = 0;
        int rc = msm_detok_push(&d, ids[i], text + len, step, &k, err);
        if (rc < 0) {
            free(text);
            return rc;
        }
        len += k;
        text[len] = 0;
        bool hit = false;
        for (int s = 0; s < n_stops && !hit; s++)
            hit = strstr(text, stops[s]) != NULL;
        if (hit) {
            keep = i + 1;
            break;
        }
    }
    free(text);
    *ret_keep = keep;
    return 0;
}
