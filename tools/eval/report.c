/* The JSON report of an evaluation run and the comparison of two reports. See msm_eval.h.
 *
 * A report is self-describing: which daemon configuration produced it (ModelInfo), which settings
 * (shots, limit, concurrency), the summary, and one record per item with the prompt's hash, the
 * generated text and token ids, the extracted answer, the reference and the verdict. compare
 * matches items by id, so two runs over the same data compare even when their orders differ. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msm_eval.h"

void msm_eval_item_done(msm_eval_item *it) {
    if (!it)
        return;
    free(it->prompt);
    free(it->output);
    free(it->ids);
    free(it->error);
    it->prompt = it->output = it->error = NULL;
    it->ids = NULL;
}

int msm_eval_item_add_text(msm_eval_item *it, const char *s, size_t n) {
    if (it->output_len + n + 1 > it->output_cap) {
        size_t cap = it->output_cap ? it->output_cap : 256;
        while (cap < it->output_len + n + 1)
            cap *= 2;
        char *p = realloc(it->output, cap);
        if (!p)
            return -ENOMEM;
        it->output = p;
        it->output_cap = cap;
    }
    if (n)
        memcpy(it->output + it->output_len, s, n);
    it->output_len += n;
    it->output[it->output_len] = 0;
    return 0;
}

int msm_eval_item_add_ids(msm_eval_item *it, const int32_t *ids, size_t n) {
    if ((size_t)it->n_ids + n > (size_t)it->cap_ids) {
        size_t cap = it->cap_ids ? (size_t)it->cap_ids : 64;
        while (cap < (size_t)it->n_ids + n)
            cap *= 2;
        if (cap > (size_t)1 << 30)
            return -EOVERFLOW;
        int32_t *p = realloc(it->ids, cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        it->ids = p;
        it->cap_ids = (int)cap;
    }
    if (n)
        memcpy(it->ids + it->n_ids, ids, n * sizeof *ids);
    it->n_ids += (int)n;
    return 0;
}

void msm_eval_prompt_hash(const char *prompt, char out[17]) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)prompt; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

json_object *msm_eval_proto_to_json(const ProtobufCMessage *m) {
    json_object *o = json_object_new_object();
    if (!o || !m)
        return o;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *base = (const char *)m + f->offset;
        const char *q = (const char *)m + f->quantifier_offset;
        json_object *v = NULL;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)q;
            if (f->type != PROTOBUF_C_TYPE_INT32 && f->type != PROTOBUF_C_TYPE_UINT32)
                continue;
            v = json_object_new_array();
            const int32_t *a = *(int32_t *const *)base;
            for (size_t k = 0; k < n; k++)
                json_object_array_add(v, f->type == PROTOBUF_C_TYPE_INT32
                                             ? json_object_new_int(a[k])
                                             : json_object_new_int64((uint32_t)a[k]));
        } else if (f->type == PROTOBUF_C_TYPE_STRING) {
            const char *s = *(char *const *)base;
            if (!s)
                continue;
            v = json_object_new_string(s);
        } else {
            if (f->label == PROTOBUF_C_LABEL_OPTIONAL && !*(const protobuf_c_boolean *)q)
                continue;
            switch (f->type) {
            case PROTOBUF_C_TYPE_BOOL: v = json_object_new_boolean(*(const protobuf_c_boolean *)base); break;
            case PROTOBUF_C_TYPE_INT32:
            case PROTOBUF_C_TYPE_ENUM: v = json_object_new_int(*(const int32_t *)base); break;
            case PROTOBUF_C_TYPE_UINT32: v = json_object_new_int64(*(const uint32_t *)base); break;
            case PROTOBUF_C_TYPE_INT64: v = json_object_new_int64(*(const int64_t *)base); break;
            case PROTOBUF_C_TYPE_UINT64: v = json_object_new_uint64(*(const uint64_t *)base); break;
            case PROTOBUF_C_TYPE_FLOAT: v = json_object_new_double(*(const float *)base); break;
            case PROTOBUF_C_TYPE_DOUBLE: v = json_object_new_double(*(const double *)base); break;
            default: continue;
            }
        }
        json_object_object_add(o, f->name, v);
    }
    return o;
}

static const char *finish_name(int r) {
    static const char *names[] = {"none", "length", "stop", "eos", "cancelled", "error"};
    return r >= 0 && r < (int)(sizeof names / sizeof *names) ? names[r] : "unknown";
}

static json_object *item_json(const msm_eval_item *it) {
    json_object *o = json_object_new_object();
    char hash[17];
    msm_eval_prompt_hash(it->prompt ? it->prompt : "", hash);
    json_object_object_add(o, "id", json_object_new_string(it->id));
    if (it->subject[0])
        json_object_object_add(o, "subject", json_object_new_string(it->subject));
    json_object_object_add(o, "prompt_hash", json_object_new_string(hash));
    json_object_object_add(o, "output", json_object_new_string_len(it->output ? it->output : "",
                                                                   (int)it->output_len));
    json_object *ids = json_object_new_array_ext(it->n_ids);
    for (int k = 0; k < it->n_ids; k++)
        json_object_array_add(ids, json_object_new_int(it->ids[k]));
    json_object_object_add(o, "output_ids", ids);
    json_object_object_add(o, "answer", it->has_answer ? json_object_new_string(it->answer) : NULL);
    json_object_object_add(o, "reference", json_object_new_string(it->reference));
    json_object_object_add(o, "correct", json_object_new_boolean(it->correct));
    if (it->has_letter_lp) {
        json_object *lp = json_object_new_object();
        for (int k = 0; k < 4; k++) {
            char key[2] = {(char)('A' + k), 0};
            json_object_object_add(lp, key, isfinite(it->letter_lp[k]) ? json_object_new_double(it->letter_lp[k]) : NULL);
        }
        json_object_object_add(o, "letter_logprobs", lp);
    }
    json_object_object_add(o, "finish_reason", json_object_new_string(finish_name(it->finish_reason)));
    json_object_object_add(o, "prompt_tokens", json_object_new_int64(it->prompt_tokens));
    json_object_object_add(o, "completion_tokens", json_object_new_int64(it->completion_tokens));
    if (it->error)
        json_object_object_add(o, "error", json_object_new_string(it->error));
    return o;
}

static bool get_bool(json_object *o, const char *key) {
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_get_boolean(v);
}

static const char *get_str(json_object *o, const char *key) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

/* Per-subject counts: {subject: [n, correct]} in first-seen order. */
static json_object *subject_counts(json_object *items) {
    json_object *m = json_object_new_object();
    size_t n = json_object_array_length(items);
    for (size_t i = 0; i < n; i++) {
        json_object *it = json_object_array_get_idx(items, i);
        const char *s = get_str(it, "subject");
        if (!s)
            continue;
        json_object *c;
        if (!json_object_object_get_ex(m, s, &c)) {
            c = json_object_new_array();
            json_object_array_add(c, json_object_new_int(0));
            json_object_array_add(c, json_object_new_int(0));
            json_object_object_add(m, s, c);
        }
        for (int k = 0; k < 2; k++) {
            if (k == 1 && !get_bool(it, "correct"))
                continue;
            json_object *x = json_object_array_get_idx(c, (size_t)k);
            json_object_set_int(x, json_object_get_int(x) + 1);
        }
    }
    return m;
}

void msm_eval_summarize(json_object *items, msm_eval_summary *ret) {
    msm_eval_summary s = {0};
    size_t n = json_object_array_length(items);
    for (size_t i = 0; i < n; i++) {
        json_object *it = json_object_array_get_idx(items, i), *e;
        s.n++;
        s.correct += get_bool(it, "correct");
        s.errors += json_object_object_get_ex(it, "error", &e) && e;
    }
    s.accuracy = s.n ? (double)s.correct / s.n : 0;
    json_object *m = subject_counts(items);
    double sum = 0;
    json_object_object_foreach(m, key, c) {
        (void)key;
        int sn = json_object_get_int(json_object_array_get_idx(c, 0));
        int sc = json_object_get_int(json_object_array_get_idx(c, 1));
        sum += sn ? (double)sc / sn : 0;
        s.n_subjects++;
    }
    s.macro = s.n_subjects ? sum / s.n_subjects : s.accuracy;
    json_object_put(m);
    *ret = s;
}

json_object *msm_eval_report_new(const char *task, const msm_eval_item *items, int n,
                                 json_object *model_info, json_object *settings, double elapsed_s) {
    json_object *r = json_object_new_object();
    json_object *arr = json_object_new_array_ext(n);
    for (int i = 0; i < n; i++)
        json_object_array_add(arr, item_json(&items[i]));
    msm_eval_summary s;
    msm_eval_summarize(arr, &s);

    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    json_object_object_add(r, "format", json_object_new_string("msmoe-eval report 1"));
    json_object_object_add(r, "task", json_object_new_string(task));
    json_object_object_add(r, "created", json_object_new_string(when));
    json_object_object_add(r, "model_info", model_info);
    json_object_object_add(r, "settings", settings);

    json_object *sum = json_object_new_object();
    json_object_object_add(sum, "n", json_object_new_int(s.n));
    json_object_object_add(sum, "correct", json_object_new_int(s.correct));
    json_object_object_add(sum, "errors", json_object_new_int(s.errors));
    json_object_object_add(sum, "accuracy", json_object_new_double(s.accuracy));
    if (s.n_subjects) {
        json_object_object_add(sum, "micro_accuracy", json_object_new_double(s.accuracy));
        json_object_object_add(sum, "macro_accuracy", json_object_new_double(s.macro));
        json_object *m = subject_counts(arr), *subj = json_object_new_object();
        json_object_object_foreach(m, key, c) {
            int sn = json_object_get_int(json_object_array_get_idx(c, 0));
            int sc = json_object_get_int(json_object_array_get_idx(c, 1));
            json_object *o = json_object_new_object();
            json_object_object_add(o, "n", json_object_new_int(sn));
            json_object_object_add(o, "correct", json_object_new_int(sc));
            json_object_object_add(o, "accuracy", json_object_new_double(sn ? (double)sc / sn : 0));
            json_object_object_add(subj, key, o);
        }
        json_object_put(m);
        json_object_object_add(sum, "subjects", subj);
    }
    json_object_object_add(sum, "elapsed_s", json_object_new_double(elapsed_s));
    json_object_object_add(sum, "items_per_s", json_object_new_double(elapsed_s > 0 ? s.n / elapsed_s : 0));
    json_object_object_add(r, "summary", sum);
    json_object_object_add(r, "items", arr);
    return r;
}

int msm_eval_first_diff(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb;
    for (int i = 0; i < n; i++)
        if (a[i] != b[i])
            return i;
    return na == nb ? -1 : n;
}

int msm_eval_report_check(json_object *r, const char *source, msm_err *err) {
    json_object *items;
    if (!r || !json_object_is_type(r, json_type_object))
        return msm_err_set(err, -EINVAL, "%s: not a JSON object", source);
    if (!get_str(r, "task"))
        return msm_err_set(err, -EINVAL, "%s: no \"task\" string: not an msmoe-eval report", source);
    if (!json_object_object_get_ex(r, "items", &items) || !json_object_is_type(items, json_type_array))
        return msm_err_set(err, -EINVAL, "%s: no \"items\" array: not an msmoe-eval report", source);
    size_t n = json_object_array_length(items);
    json_object *seen = json_object_new_object();
    for (size_t i = 0; i < n; i++) {
        json_object *it = json_object_array_get_idx(items, i), *ids;
        if (!json_object_is_type(it, json_type_object) || !get_str(it, "id")) {
            json_object_put(seen);
            return msm_err_set(err, -EINVAL, "%s: items[%zu] has no \"id\" string", source, i);
        }
        if (json_object_object_get_ex(seen, get_str(it, "id"), NULL)) {
            json_object_put(seen);
            return msm_err_set(err, -EINVAL, "%s: items[%zu]: id \"%s\" appears twice", source, i,
                               get_str(it, "id"));
        }
        json_object_object_add(seen, get_str(it, "id"), NULL);
        if (json_object_object_get_ex(it, "output_ids", &ids) && ids) {
            bool ok = json_object_is_type(ids, json_type_array);
            for (size_t k = 0; ok && k < json_object_array_length(ids); k++)
                ok = json_object_is_type(json_object_array_get_idx(ids, k), json_type_int);
            if (!ok) {
                json_object_put(seen);
                return msm_err_set(err, -EINVAL, "%s: items[%zu].output_ids is not an array of integers",
                                   source, i);
            }
        }
    }
    json_object_put(seen);
    return 0;
}

/* The token ids of an item, or NULL when the report gives none (malloc'ed). */
static int32_t *item_ids(json_object *it, int *ret_n) {
    json_object *ids;
    *ret_n = 0;
    if (!json_object_object_get_ex(it, "output_ids", &ids) || !ids)
        return NULL;
    int n = (int)json_object_array_length(ids);
    int32_t *v = malloc(((size_t)n + 1) * sizeof *v);
    if (!v)
        return NULL;
    for (int k = 0; k < n; k++)
        v[k] = json_object_get_int(json_object_array_get_idx(ids, (size_t)k));
    *ret_n = n;
    return v;
}

static void print_output(FILE *out, const char *label, json_object *it) {
    const char *ans = get_str(it, "answer");
    json_object *o;
    const char *text = json_object_object_get_ex(it, "output", &o) && o
                           ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_NOSLASHESCAPE)
                           : "(none)";
    fprintf(out, "    %s: answer %s (%s)%s%s: %s\n", label, ans ? ans : "(none)",
            get_bool(it, "correct") ? "correct" : "wrong", get_str(it, "error") ? " error: " : "",
            get_str(it, "error") ? get_str(it, "error") : "", text);
}

static void print_head(FILE *out, const char *label, const char *name, json_object *r,
                       const msm_eval_summary *s) {
    json_object *mi;
    fprintf(out, "%s: %s: %s accuracy %.4f (%d/%d)", label, name, get_str(r, "task"), s->accuracy,
            s->correct, s->n);
    if (s->n_subjects)
        fprintf(out, ", macro %.4f over %d subjects", s->macro, s->n_subjects);
    if (s->errors)
        fprintf(out, ", %d errors", s->errors);
    fprintf(out, "\n");
    if (json_object_object_get_ex(r, "model_info", &mi) && mi)
        fprintf(out, "   model_info %s\n", json_object_to_json_string_ext(mi, JSON_C_TO_STRING_NOSLASHESCAPE));
}

int msm_eval_compare(json_object *a, json_object *b, const char *name_a, const char *name_b,
                     FILE *out, int max_print, msm_eval_compare_result *ret, msm_err *err) {
    const char *ta = get_str(a, "task"), *tb = get_str(b, "task");
    if (!ta || !tb || strcmp(ta, tb) != 0)
        return msm_err_set(err, -EINVAL, "%s is a %s report but %s is a %s report", name_a,
                           ta ? ta : "?", name_b, tb ? tb : "?");
    json_object *ia, *ib;
    json_object_object_get_ex(a, "items", &ia);
    json_object_object_get_ex(b, "items", &ib);
    msm_eval_compare_result r = {0};
    msm_eval_summarize(ia, &r.a);
    msm_eval_summarize(ib, &r.b);

    /* Index B's items by id. */
    json_object *by_id = json_object_new_object();
    size_t nb = json_object_array_length(ib), na = json_object_array_length(ia);
    for (size_t i = 0; i < nb; i++) {
        json_object *it = json_object_array_get_idx(ib, i);
        json_object_object_add(by_id, get_str(it, "id"), json_object_get(it));
    }
    if (out) {
        print_head(out, "A", name_a, a, &r.a);
        print_head(out, "B", name_b, b, &r.b);
    }
    int printed = 0, differ = 0;
    for (size_t i = 0; i < na; i++) {
        json_object *x = json_object_array_get_idx(ia, i), *y;
        const char *id = get_str(x, "id");
        if (!json_object_object_get_ex(by_id, id, &y)) {
            r.only_a++;
            continue;
        }
        r.n_common++;
        const char *ha = get_str(x, "prompt_hash"), *hb = get_str(y, "prompt_hash");
        if (ha && hb && strcmp(ha, hb) != 0)
            r.prompt_mismatch++;
        const char *aa = get_str(x, "answer"), *ab = get_str(y, "answer");
        bool agree = (!aa && !ab) || (aa && ab && strcmp(aa, ab) == 0);
        r.n_agree += agree;
        int nx, ny;
        int32_t *vx = item_ids(x, &nx), *vy = item_ids(y, &ny);
        int first = -2; /* -2: no ids to compare */
        if (vx && vy) {
            r.n_with_ids++;
            first = msm_eval_first_diff(vx, nx, vy, ny);
            r.n_identical += first < 0;
        }
        if (!agree) {
            differ++;
            if (out && (max_print < 0 || printed < max_print)) {
                if (printed == 0)
                    fprintf(out, "differing items:\n");
                printed++;
                const char *ref = get_str(x, "reference");
                fprintf(out, "  %s (reference %s)\n", id, ref ? ref : "?");
                print_output(out, "A", x);
                print_output(out, "B", y);
                if (first >= 0) {
                    char tx[16] = "end", ty[16] = "end";
                    if (first < nx)
                        snprintf(tx, sizeof tx, "%d", vx[first]);
                    if (first < ny)
                        snprintf(ty, sizeof ty, "%d", vy[first]);
                    fprintf(out, "    first differing token: index %d (A %s, B %s)\n", first, tx, ty);
                }
            }
        }
        free(vx);
        free(vy);
    }
    r.only_b = (int)nb - r.n_common; /* ids are unique within a report (checked) */
    json_object_put(by_id);
    r.agreement = r.n_common ? (double)r.n_agree / r.n_common : 0;
    if (out) {
        if (printed < differ)
            fprintf(out, "  ... and %d more differing items\n", differ - printed);
        fprintf(out, "common items: %d", r.n_common);
        if (r.only_a || r.only_b)
            fprintf(out, " (only in A: %d, only in B: %d)", r.only_a, r.only_b);
        fprintf(out, "\nagreement: %.2f%% (%d/%d same answer)\n", 100 * r.agreement, r.n_agree, r.n_common);
        if (r.n_with_ids)
            fprintf(out, "identical outputs: %d/%d (same token ids)\n", r.n_identical, r.n_with_ids);
        if (r.prompt_mismatch)
            fprintf(out, "warning: %d common items have different prompts (prompt_hash): the runs "
                         "used different settings or data\n", r.prompt_mismatch);
    }
    *ret = r;
    return 0;
}
