/* Graph passes and the verifier: the regression suite of the aux-stream all-reduce fix
 * (docs BACKGROUND.md), then more. Graphs are built from the golden tiny models' configs. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "msm_graph.h"
#include "msm_pass.h"

static msm_graph *plain(const char *dir, int tp) {
    msm_model_config c;
    msm_err err = {{0}};
    cr_assert_eq(msm_model_config_load(dir, &c, &err), 0, "%s", err.msg);
    msm_build_opts bo = {.max_T = 32, .max_S = 4, .max_blocks = 8};
    msm_graph *g;
    cr_assert_eq(msm_graph_build(&c, 0, tp, &bo, &g, &err), 0, "%s", err.msg);
    return g;
}

static msm_graph *pass_ms(const msm_graph *g, const msm_pass_opts *o) {
    msm_graph *out;
    msm_err err = {{0}};
    cr_assert_eq(msm_pass_multi_stream_moe(g, o, &out, &err), 0, "%s", err.msg);
    return out;
}

static msm_graph *pass_fuse(const msm_graph *g) {
    msm_graph *out;
    msm_err err = {{0}};
    msm_pass_opts o = {0};
    cr_assert_eq(msm_pass_fuse_moe_allreduce(g, &o, &out, &err), 0, "%s", err.msg);
    return out;
}

static int find(const msm_graph *g, int layer, msm_op op, msm_role role, int from) {
    for (int i = from; i < g->n_nodes; i++)
        if (g->nodes[i].layer == layer && g->nodes[i].op == op && g->nodes[i].role == role) return i;
    return -1;
}

static int count(const msm_graph *g, int layer, msm_op op, msm_stream s) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        n += g->nodes[i].layer == layer && g->nodes[i].op == op && g->nodes[i].stream == s;
    return n;
}

static void verify_ok(msm_graph *g) {
    msm_err err = {{0}};
    cr_assert_eq(msm_graph_plan(g, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_graph_verify(g, &err), 0, "%s", err.msg);
}

/* qwen2moe-gqa: 4 layers, layer 1 dense (mlp_only_layers) */
static const int sparse_layers[] = {0, 2, 3};

Test(graph_pass, trailing_shared_allreduce_is_placed_after_join_on_main) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 2);
    msm_pass_opts o = {.multi_stream = true};
    msm_graph *m = pass_ms(g, &o);
    for (int k = 0; k < 3; k++) {
        int L = sparse_layers[k];
        int ar = find(m, L, MSM_OP_ALLREDUCE, MSM_ROLE_SHARED, 0);
        cr_assert_geq(ar, 0);
        cr_expect_eq(m->nodes[ar].stream, MSM_STREAM_MAIN, "layer %d: shared ALLREDUCE not on main", L);
        /* the join (EVENT_WAIT on main) precedes it */
        int join = -1;
        for (int i = 0; i < ar; i++)
            if (m->nodes[i].layer == L && m->nodes[i].op == MSM_OP_EVENT_WAIT && m->nodes[i].stream == MSM_STREAM_MAIN)
                join = i;
        cr_expect_geq(join, 0, "layer %d: no join before the shared ALLREDUCE", L);
        /* the shared compute before the collective is on aux, issued before the routed work */
        int first_routed = find(m, L, MSM_OP_LINEAR, MSM_ROLE_ROUTED, 0);
        int n_aux = 0;
        for (int i = 0; i < m->n_nodes; i++) {
            const msm_node *n = &m->nodes[i];
            if (n->layer != L || n->stream != MSM_STREAM_AUX || n->op == MSM_OP_EVENT_WAIT ||
                n->op == MSM_OP_EVENT_RECORD)
                continue;
            n_aux++;
            cr_expect_eq(n->role, MSM_ROLE_SHARED);
            cr_expect_lt(i, first_routed, "layer %d: aux node %d issued after the routed work", L, i);
            cr_expect(!msm_op_is_collective(n->op));
        }
        cr_expect_eq(n_aux, 5, "layer %d: gate_up, swiglu, down, gate, sigmoid on aux (got %d)", L, n_aux);
        cr_expect_eq(count(m, L, MSM_OP_ALLREDUCE, MSM_STREAM_AUX), 0);
    }
    verify_ok(m);
    msm_graph_free(m);
    msm_graph_free(g);
}

/* The multi-stream pass with the router issued first (router_first: the router's nodes between
 * the fork's RECORD and the aux WAIT) or alone (router_alone: the router's nodes before the fork's
 * RECORD, so the aux branch waits for the router); either way the shared branch is still issued
 * before the routed experts and the schedule still verifies. */
static void check_router_order(bool alone) {
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/glm4moe"};
    for (int d = 0; d < 2; d++)
        for (int tp = 1; tp <= 2; tp++) {
            msm_graph *g = plain(dirs[d], tp);
            msm_pass_opts o = {.multi_stream = true, .router_first = !alone, .router_alone = alone};
            msm_graph *m = pass_ms(g, &o);
            int layers = 0;
            for (int L = 0; L < m->n_layers; L++) {
                int experts = find(m, L, MSM_OP_MOE_EXPERTS, MSM_ROLE_ROUTED, 0);
                int fork = -1, wait = -1, router = -1;
                for (int i = 0; i < m->n_nodes; i++) {
                    const msm_node *n = &m->nodes[i];
                    if (n->layer != L) continue;
                    if (n->op == MSM_OP_EVENT_RECORD && n->stream == MSM_STREAM_MAIN && fork < 0) fork = i;
                    if (n->op == MSM_OP_EVENT_WAIT && n->stream == MSM_STREAM_AUX && wait < 0) wait = i;
                    if ((n->op == MSM_OP_ROUTER_TOPK || n->op == MSM_OP_ROUTER_GROUP_TOPK) && router < 0) router = i;
                }
                if (wait < 0) continue; /* no shared expert in this layer */
                layers++;
                if (alone) {
                    cr_expect(router >= 0 && router < fork && fork + 1 == wait,
                              "%s tp %d layer %d: router %d fork %d wait %d", dirs[d], tp, L, router, fork, wait);
                    cr_expect_eq(m->nodes[fork - 1].op, m->nodes[router].op, "the fork right after the router");
                } else {
                    cr_expect(fork >= 0 && router > fork && router < wait, "%s tp %d layer %d: fork %d router %d wait %d",
                              dirs[d], tp, L, fork, router, wait);
                    cr_expect_eq(m->nodes[fork + 1].role, MSM_ROLE_ROUTED, "the router's linear right after the fork");
                }
                for (int i = wait; i < m->n_nodes; i++)
                    if (m->nodes[i].layer == L && m->nodes[i].stream == MSM_STREAM_AUX)
                        cr_expect_lt(i, experts, "%s layer %d: aux node %d after the routed experts", dirs[d], L, i);
            }
            cr_expect_gt(layers, 0, "%s: no layer with a shared expert", dirs[d]);
            verify_ok(m);
            msm_graph_free(m);
            msm_graph_free(g);
        }
}

Test(graph_pass, router_first_issues_the_router_before_the_aux_branch) { check_router_order(false); }
Test(graph_pass, router_alone_forks_the_aux_branch_after_the_router) { check_router_order(true); }

typedef struct warnings {
    int n;
    char last[256];
} warnings;

static void on_warn(void *ud, const char *msg) {
    warnings *w = ud;
    w->n++;
    snprintf(w->last, sizeof w->last, "%s", msg);
}

Test(graph_pass, mid_branch_collective_skips_the_layer_with_a_warning) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 2);
    /* insert ALLREDUCE between layer 0's shared gate_up LINEAR and its SWIGLU */
    int gu = find(g, 0, MSM_OP_LINEAR, MSM_ROLE_SHARED, 0);
    int sw = find(g, 0, MSM_OP_SWIGLU, MSM_ROLE_SHARED, 0);
    cr_assert(gu >= 0 && sw > gu);
    int v = msm_graph_value(g, "mid_ar0", MSM_F32, MSM_ROWS_T, g->vals[g->nodes[gu].out[0]].cols);
    msm_node ar = {.op = MSM_OP_ALLREDUCE, .stream = MSM_STREAM_MAIN, .role = MSM_ROLE_SHARED, .layer = 0,
                   .n_in = 1, .n_out = 1, .in = {g->nodes[gu].out[0]}, .out = {v}, .w = {-1, -1, -1}, .event = -1};
    g->nodes[sw].in[0] = v;
    msm_graph_insert(g, sw, &ar);
    warnings w = {0};
    msm_pass_opts o = {.multi_stream = true, .warn = on_warn, .warn_ud = &w};
    msm_graph *m = pass_ms(g, &o);
    cr_expect_eq(w.n, 1, "one warning expected, got %d", w.n);
    cr_expect(strstr(w.last, "layer 0") != NULL, "warning: %s", w.last);
    cr_expect(strstr(w.last, "mid_ar0") != NULL, "warning must name the collective: %s", w.last);
    for (int i = 0; i < m->n_nodes; i++)
        if (m->nodes[i].layer == 0) cr_expect_eq(m->nodes[i].stream, MSM_STREAM_MAIN, "layer 0 must be untouched");
    cr_expect_gt(count(m, 2, MSM_OP_EVENT_RECORD, MSM_STREAM_AUX), 0, "layer 2 is still rewritten");
    verify_ok(m);
    msm_graph_free(m);
    msm_graph_free(g);
}

Test(graph_pass, collective_free_branch_keeps_plain_fork_join) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 2), *f = pass_fuse(g);
    msm_pass_opts o = {.multi_stream = true};
    msm_graph *m = pass_ms(f, &o);
    for (int k = 0; k < 3; k++) {
        int L = sparse_layers[k];
        cr_expect_eq(count(m, L, MSM_OP_EVENT_RECORD, MSM_STREAM_MAIN), 1);
        cr_expect_eq(count(m, L, MSM_OP_EVENT_WAIT, MSM_STREAM_AUX), 1);
        cr_expect_eq(count(m, L, MSM_OP_EVENT_RECORD, MSM_STREAM_AUX), 1);
        cr_expect_eq(count(m, L, MSM_OP_EVENT_WAIT, MSM_STREAM_MAIN), 1);
        for (int i = 0; i < m->n_nodes; i++) {
            const msm_node *n = &m->nodes[i];
            if (n->layer == L && n->role == MSM_ROLE_SHARED && n->op != MSM_OP_EVENT_RECORD &&
                n->op != MSM_OP_EVENT_WAIT)
                cr_expect_eq(n->stream, MSM_STREAM_AUX, "layer %d: shared %s not on aux", L, msm_op_name(n->op));
        }
        /* fused: attention + one MoE all-reduce per layer, both on main */
        cr_expect_eq(count(m, L, MSM_OP_ALLREDUCE, MSM_STREAM_MAIN), 2);
        cr_expect_eq(count(m, L, MSM_OP_ALLREDUCE, MSM_STREAM_AUX), 0);
    }
    verify_ok(m);
    msm_graph_free(m);
    msm_graph_free(f);
    msm_graph_free(g);
}

Test(graph_pass, models_without_shared_expert_are_untouched) {
    const char *dirs[] = {"tests/data/qwen3moe", "tests/data/mixtral"};
    for (int d = 0; d < 2; d++) {
        msm_graph *g = plain(dirs[d], 2);
        msm_pass_opts o = {.multi_stream = true};
        msm_graph *m = pass_ms(g, &o), *f = pass_fuse(g);
        cr_expect(msm_graph_equal(g, m), "%s: multi_stream_moe changed the graph", dirs[d]);
        cr_expect(msm_graph_equal(g, f), "%s: fuse_moe_allreduce changed the graph", dirs[d]);
        msm_graph_free(m);
        msm_graph_free(f);
        msm_graph_free(g);
    }
}

Test(graph_pass, multi_layer_graphs_are_rewritten_layer_by_layer) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 1);
    msm_pass_opts o = {.multi_stream = true};
    msm_graph *m = pass_ms(g, &o);
    cr_expect_eq(m->n_events, 6, "two events per sparse layer with a shared expert");
    cr_expect_eq(count(m, 1, MSM_OP_EVENT_RECORD, MSM_STREAM_MAIN), 0, "the dense layer has no fork");
    for (int k = 0; k < 3; k++) cr_expect_eq(count(m, sparse_layers[k], MSM_OP_EVENT_RECORD, MSM_STREAM_MAIN), 1);
    msm_graph_free(m);
    msm_graph_free(g);
}

Test(graph_pass, applying_a_pass_twice_changes_nothing) {
    msm_graph *g = plain("tests/data/qwen2moe-mha-tied", 2);
    msm_pass_opts o = {.multi_stream = true};
    msm_graph *m1 = pass_ms(g, &o), *m2 = pass_ms(m1, &o);
    cr_expect(msm_graph_equal(m1, m2), "multi_stream_moe is not idempotent");
    msm_graph *f1 = pass_fuse(g), *f2 = pass_fuse(f1);
    cr_expect(msm_graph_equal(f1, f2), "fuse_moe_allreduce is not idempotent");
    msm_graph *fm1 = pass_ms(f1, &o), *fm2 = pass_ms(fm1, &o), *fm3 = pass_fuse(fm1);
    cr_expect(msm_graph_equal(fm1, fm2));
    cr_expect(msm_graph_equal(fm1, fm3), "fusion after multi-stream must find nothing left to fuse");
    msm_graph *list[] = {m1, m2, f1, f2, fm1, fm2, fm3, g};
    for (int i = 0; i < 8; i++) msm_graph_free(list[i]);
}

Test(graph_pass, fusion_halves_the_moe_collectives) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 2), *f = pass_fuse(g);
    int before = 0, after = 0;
    for (int i = 0; i < g->n_nodes; i++) before += g->nodes[i].op == MSM_OP_ALLREDUCE;
    for (int i = 0; i < f->n_nodes; i++) after += f->nodes[i].op == MSM_OP_ALLREDUCE;
    cr_expect_eq(before - after, 3, "one all-reduce fewer per MoE layer with a shared expert");
    verify_ok(f);
    msm_graph_free(f);
    msm_graph_free(g);
}

Test(graph_verify, refuses_a_collective_on_aux_and_names_it) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 2);
    msm_pass_opts o = {.multi_stream = true, .test_buggy_placement = true};
    msm_graph *m = pass_ms(g, &o);
    msm_err err = {{0}};
    cr_assert_eq(msm_graph_plan(m, &err), 0);
    cr_expect_neq(msm_graph_verify(m, &err), 0);
    cr_expect(strstr(err.msg, "V1") && strstr(err.msg, "ALLREDUCE") && strstr(err.msg, "shared_sum0"),
              "message: %s", err.msg);
    msm_graph *fixed;
    o.test_buggy_placement = false;
    cr_expect_eq(msm_passes_apply(g, &o, &fixed, &err), 0, "%s", err.msg);
    msm_graph_free(fixed);
    msm_graph_free(m);
    msm_graph_free(g);
}

/* a tiny hand-made graph: x (input) -> a = SIGMOID(x) on aux -> b = ADD(a, x) on main */
static msm_graph *tiny(bool record, bool wait, bool wait_first) {
    msm_graph *g = msm_graph_new(0, 1);
    g->max_T = 4;
    g->max_R = 4;
    g->max_S = 1;
    g->n_layers = 1;
    int x = msm_graph_value(g, "x", MSM_F32, MSM_ROWS_T, 8);
    g->vals[x].io = true;
    int a = msm_graph_value(g, "a", MSM_F32, MSM_ROWS_T, 8), b = msm_graph_value(g, "b", MSM_F32, MSM_ROWS_T, 8);
    g->n_events = 2;
    msm_node fork_r = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_MAIN, .event = 0, .w = {-1, -1, -1}};
    msm_node fork_w = {.op = MSM_OP_EVENT_WAIT, .stream = MSM_STREAM_AUX, .event = 0, .w = {-1, -1, -1}};
    msm_node sig = {.op = MSM_OP_SIGMOID, .stream = MSM_STREAM_AUX, .n_in = 1, .n_out = 1, .in = {x}, .out = {a}, .w = {-1, -1, -1}};
    msm_node jr = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_AUX, .event = 1, .w = {-1, -1, -1}};
    msm_node jw = {.op = MSM_OP_EVENT_WAIT, .stream = MSM_STREAM_MAIN, .event = 1, .w = {-1, -1, -1}};
    msm_node add = {.op = MSM_OP_ADD, .stream = MSM_STREAM_MAIN, .n_in = 2, .n_out = 1, .in = {a, x}, .out = {b}, .w = {-1, -1, -1}};
    msm_graph_add(g, &fork_r);
    msm_graph_add(g, &fork_w);
    if (wait && wait_first) msm_graph_add(g, &jw);
    msm_graph_add(g, &sig);
    if (record) msm_graph_add(g, &jr);
    if (wait && !wait_first) msm_graph_add(g, &jw);
    msm_graph_add(g, &add);
    return g;
}

Test(graph_verify, accepts_a_covered_cross_stream_read) {
    msm_graph *g = tiny(true, true, false);
    msm_err err = {{0}};
    cr_expect_eq(msm_graph_verify(g, &err), 0, "%s", err.msg);
    msm_graph_free(g);
}

Test(graph_verify, refuses_a_cross_stream_read_without_wait) {
    msm_graph *g = tiny(true, false, false);
    msm_err err = {{0}};
    cr_expect_neq(msm_graph_verify(g, &err), 0);
    cr_expect(strstr(err.msg, "V2") && strstr(err.msg, "ADD"), "message: %s", err.msg);
    msm_graph_free(g);
}

Test(graph_verify, refuses_a_wait_issued_before_its_record) {
    msm_graph *g = tiny(true, true, true);
    msm_err err = {{0}};
    cr_expect_neq(msm_graph_verify(g, &err), 0);
    cr_expect(strstr(err.msg, "not yet recorded"), "message: %s", err.msg);
    msm_graph_free(g);
}

Test(graph_verify, refuses_an_unjoined_fork) {
    msm_graph *g = tiny(true, false, false);
    g->n_nodes--; /* drop the ADD: nothing reads a, but aux work is never joined */
    msm_err err = {{0}};
    cr_expect_neq(msm_graph_verify(g, &err), 0);
    cr_expect(strstr(err.msg, "V3"), "message: %s", err.msg);
    msm_graph_free(g);
}

/* No value touched on aux shares bytes with a value touched on main inside the same region. */
Test(graph_plan, aux_values_never_share_bytes_with_the_concurrent_main_work) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 2);
    msm_graph *out;
    msm_err err = {{0}};
    msm_pass_opts o = {.multi_stream = true};
    cr_assert_eq(msm_passes_apply(g, &o, &out, &err), 0, "%s", err.msg);
    int fork = -1;
    for (int i = 0; i < out->n_nodes; i++) {
        const msm_node *n = &out->nodes[i];
        if (n->op == MSM_OP_EVENT_RECORD && n->stream == MSM_STREAM_MAIN) fork = i;
        if (n->op != MSM_OP_EVENT_WAIT || n->stream != MSM_STREAM_MAIN) continue;
        for (int a = fork; a < i; a++)
            for (int b = fork; b < i; b++) {
                const msm_node *x = &out->nodes[a], *y = &out->nodes[b];
                if (x->stream != MSM_STREAM_AUX || y->stream != MSM_STREAM_MAIN) continue;
                for (int p = 0; p < x->n_in + x->n_out; p++)
                    for (int q = 0; q < y->n_in + y->n_out; q++) {
                        int u = p < x->n_in ? x->in[p] : x->out[p - x->n_in];
                        int v = q < y->n_in ? y->in[q] : y->out[q - y->n_in];
                        if (u == v) continue;
                        size_t u0 = out->vals[u].offset, u1 = u0 + msm_value_bytes_max(out, &out->vals[u]);
                        size_t v0 = out->vals[v].offset, v1 = v0 + msm_value_bytes_max(out, &out->vals[v]);
                        cr_expect(u1 <= v0 || v1 <= u0, "%s (aux) overlaps %s (main)", out->vals[u].name, out->vals[v].name);
                    }
            }
    }
    msm_graph_free(out);
    msm_graph_free(g);
}

/* The n values vs of out share no bytes in its arena (a value listed twice is one value). */
static void expect_disjoint(const msm_graph *out, const char *model, const int *vs, int n) {
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            if (vs[a] == vs[b]) continue;
            int u = vs[a], v = vs[b];
            size_t u0 = out->vals[u].offset, u1 = u0 + msm_value_bytes_max(out, &out->vals[u]);
            size_t v0 = out->vals[v].offset, v1 = v0 + msm_value_bytes_max(out, &out->vals[v]);
            cr_expect(u1 <= v0 || v1 <= u0, "%s: %s overlaps %s", model, out->vals[u].name, out->vals[v].name);
        }
}

/* An ADD_RMSNORM whose norm the next node, a LINEAR or a fused router on the same stream, reads
 * keeps its inputs and outputs live through that node: the CUDA backend may run the two as one
 * kernel (msm_cuda_norm_linear, msm_cuda_norm_router_linear_topk), whose blocks read the norm's
 * inputs while block 0 writes the norm's outputs and all write the next node's, so none of them
 * share bytes (the final norm's residual sum, which nothing reads, included). */
Test(graph_plan, norm_inputs_stay_live_through_the_linear_on_the_norm) {
    static const char *models[] = {"tests/data/qwen3moe", "tests/data/qwen2moe-gqa", "tests/data/mixtral"};
    int pairs = 0, router_pairs = 0;
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        msm_graph *g = plain(models[m], 1), *out;
        msm_err err = {{0}};
        msm_pass_opts o = {.elide_collectives = true, .fuse_add_norm = true, .fuse_rope_kv = true, .fuse_router = true};
        cr_assert_eq(msm_passes_apply(g, &o, &out, &err), 0, "%s", err.msg);
        for (int i = 0; i + 1 < out->n_nodes; i++) {
            const msm_node *n = &out->nodes[i], *l = &out->nodes[i + 1];
            bool router = l->op == MSM_OP_ROUTER_LINEAR_TOPK;
            if (n->op != MSM_OP_ADD_RMSNORM || (l->op != MSM_OP_LINEAR && !router) || l->in[0] != n->out[1]) continue;
            pairs += !router, router_pairs += router;
            /* a LINEAR's one output listed twice */
            const int vs[6] = {n->in[0], n->in[1], n->out[0], n->out[1], l->out[0], router ? l->out[1] : l->out[0]};
            expect_disjoint(out, models[m], vs, 6);
        }
        msm_graph_free(out);
        msm_graph_free(g);
    }
    cr_expect(pairs > 0, "no ADD_RMSNORM -> LINEAR pair in the graphs");
    cr_expect(router_pairs > 0, "no ADD_RMSNORM -> ROUTER_LINEAR_TOPK pair (qwen3moe, mixtral)");
}

/* ... and through the SWIGLU after that LINEAR, reading its product on the same stream (the CUDA
 * backend's msm_cuda_norm_linear_swiglu: block 0 writes the norm's outputs while every block reads
 * its inputs and writes the SWIGLU's): the SWIGLU's output shares no bytes with the norm's inputs
 * and outputs. A dense MLP's (qwen2moe-gqa's layer 1, glm4moe's layer 0) on MAIN, and with
 * fork_before_norm a shared expert's on AUX. */
Test(graph_plan, norm_inputs_stay_live_through_the_swiglu_after_the_linear_on_the_norm) {
    static const char *models[] = {"tests/data/qwen2moe-gqa", "tests/data/glm4moe"};
    int triples[MSM_N_STREAMS] = {0};
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        msm_graph *g = plain(models[m], 1), *out;
        msm_err err = {{0}};
        msm_pass_opts o = {.elide_collectives = true, .fuse_add_norm = true, .fuse_rope_kv = true, .fuse_router = true,
                           .fuse_moe_combine = true, .multi_stream = true, .router_first = true, .fork_before_norm = true};
        cr_assert_eq(msm_passes_apply(g, &o, &out, &err), 0, "%s", err.msg);
        for (int i = 0; i + 2 < out->n_nodes; i++) {
            const msm_node *n = &out->nodes[i], *l = &out->nodes[i + 1], *sw = &out->nodes[i + 2];
            if (n->op != MSM_OP_ADD_RMSNORM || l->op != MSM_OP_LINEAR || sw->op != MSM_OP_SWIGLU ||
                l->in[0] != n->out[1] || sw->in[0] != l->out[0] || l->stream != n->stream || sw->stream != n->stream)
                continue;
            triples[n->stream]++;
            const int vs[5] = {n->in[0], n->in[1], n->out[0], n->out[1], sw->out[0]};
            expect_disjoint(out, models[m], vs, 5);
        }
        msm_graph_free(out);
        msm_graph_free(g);
    }
    cr_expect(triples[MSM_STREAM_MAIN] > 0, "no dense MLP's norm -> gate/up -> SwiGLU on MAIN");
    cr_expect(triples[MSM_STREAM_AUX] > 0, "no shared expert's norm -> gate/up -> SwiGLU on AUX");
}

/* ... and through the QK_NORM after that LINEAR and the ROPE_KV_WRITE after it (the CUDA backend's
 * msm_cuda_norm_linear_qk_rope: block 0 writes the norm's outputs while every block reads its inputs
 * and the heads' lead blocks write the rotated rows): those rows share no bytes with the norm's
 * inputs and outputs. Qwen3-MoE's layers past the first (the first's norm has no residual add). */
Test(graph_plan, norm_inputs_stay_live_through_the_qk_rope_after_the_linear_on_the_norm) {
    msm_graph *g = plain("tests/data/qwen3moe", 1), *out;
    msm_err err = {{0}};
    msm_pass_opts o = {.elide_collectives = true, .fuse_add_norm = true, .fuse_rope_kv = true, .fuse_router = true,
                       .fuse_moe_combine = true, .multi_stream = true, .router_first = true};
    cr_assert_eq(msm_passes_apply(g, &o, &out, &err), 0, "%s", err.msg);
    int quads = 0;
    for (int i = 0; i + 3 < out->n_nodes; i++) {
        const msm_node *n = &out->nodes[i], *l = &out->nodes[i + 1], *q = &out->nodes[i + 2], *r = &out->nodes[i + 3];
        if (n->op != MSM_OP_ADD_RMSNORM || l->op != MSM_OP_LINEAR || q->op != MSM_OP_QK_NORM ||
            r->op != MSM_OP_ROPE_KV_WRITE || l->in[0] != n->out[1] || q->in[0] != l->out[0] || r->in[0] != q->out[0])
            continue;
        quads++;
        const int vs[5] = {n->in[0], n->in[1], n->out[0], n->out[1], r->out[0]};
        expect_disjoint(out, "tests/data/qwen3moe", vs, 5);
    }
    cr_expect_eq(quads, out->n_layers - 1, "an ADD_RMSNORM -> qkv -> QK_NORM -> ROPE_KV_WRITE run in every layer past the first");
    msm_graph_free(out);
    msm_graph_free(g);
}

/* A MOE_EXPERTS whose sum the next node past events on its stream reads (an ADD_RMSNORM, or a
 * shared expert's MOE_COMBINE_NORM behind the aux stream's join) keeps its values live through that
 * node: the CUDA backend may leave the experts' combine to it (msm_cuda_moe_add_rmsnorm /
 * msm_cuda_moe_combine_rmsnorm_routed read the routing's ids and weights while they write the
 * norm's outputs), so those outputs share no bytes with the experts' inputs. */
Test(graph_plan, moe_inputs_stay_live_through_the_norm_reading_their_sum) {
    static const char *models[] = {"tests/data/qwen3moe", "tests/data/qwen2moe-gqa"};
    int found[2] = {0};
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        msm_graph *g = plain(models[mi], 1), *out;
        msm_err err = {{0}};
        msm_pass_opts o = {.elide_collectives = true, .fuse_add_norm = true, .fuse_rope_kv = true, .fuse_router = true,
                           .fuse_moe_combine = true, .multi_stream = true, .router_first = true};
        cr_assert_eq(msm_passes_apply(g, &o, &out, &err), 0, "%s", err.msg);
        for (int i = 0; i < out->n_nodes; i++) {
            const msm_node *n = &out->nodes[i];
            if (n->op != MSM_OP_MOE_EXPERTS) continue;
            int j = i + 1;
            while (j < out->n_nodes && out->nodes[j].op == MSM_OP_EVENT_WAIT) j++;
            cr_assert_lt(j, out->n_nodes);
            const msm_node *r = &out->nodes[j];
            bool norm = r->op == MSM_OP_ADD_RMSNORM, shared = r->op == MSM_OP_MOE_COMBINE_NORM;
            cr_assert(norm || shared, "%s: the node after the experts is %s", models[mi], msm_op_name(r->op));
            found[shared]++;
            const int vs[5] = {n->in[0], n->in[1], n->in[2], r->out[0], r->out[1]};
            expect_disjoint(out, models[mi], vs, 5);
        }
        msm_graph_free(out);
        msm_graph_free(g);
    }
    cr_expect(found[0] > 0, "no experts read by an ADD_RMSNORM (qwen3moe)");
    cr_expect(found[1] > 0, "no experts read by a MOE_COMBINE_NORM (qwen2moe-gqa)");
}

/* A LINEAR whose product the next node, a ROPE_KV_WRITE on the same stream, reads keeps its input
 * live through that node: the CUDA backend may run the two as one kernel (msm_cuda_linear_rope_kv),
 * whose blocks read the LINEAR's input while others write the rotated rows, so the input, the
 * product and the rotated rows share no bytes. */
Test(graph_plan, linear_input_stays_live_through_the_rope_on_its_product) {
    static const char *models[] = {"tests/data/qwen2moe-gqa", "tests/data/glm4moe", "tests/data/mixtral"};
    int pairs = 0;
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        msm_graph *g = plain(models[m], 1), *out;
        msm_err err = {{0}};
        msm_pass_opts o = {.elide_collectives = true, .fuse_add_norm = true, .fuse_rope_kv = true, .fuse_router = true,
                           .fuse_moe_combine = true, .multi_stream = true};
        cr_assert_eq(msm_passes_apply(g, &o, &out, &err), 0, "%s", err.msg);
        for (int i = 0; i + 1 < out->n_nodes; i++) {
            const msm_node *l = &out->nodes[i], *r = &out->nodes[i + 1];
            if (l->op != MSM_OP_LINEAR || r->op != MSM_OP_ROPE_KV_WRITE || r->in[0] != l->out[0]) continue;
            pairs++;
            const int vs[3] = {l->in[0], l->out[0], r->out[0]};
            expect_disjoint(out, models[m], vs, 3);
        }
        msm_graph_free(out);
        msm_graph_free(g);
    }
    cr_expect(pairs > 0, "no LINEAR -> ROPE_KV_WRITE pair in the graphs");
}

/* msm_graph_dump of model dir's rank-0 graph at tp after the passes o (the caller frees it). */
static char *dump_of(const char *dir, int tp, const msm_pass_opts *o) {
    msm_graph *g = plain(dir, tp), *out;
    msm_err err = {{0}};
    cr_assert_eq(msm_passes_apply(g, o, &out, &err), 0, "%s", err.msg);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    msm_graph_dump(out, f);
    fclose(f);
    msm_graph_free(out);
    msm_graph_free(g);
    return buf;
}

Test(graph_dump, shows_allreduce_on_main_and_shared_expert_on_aux) {
    msm_pass_opts o = {.multi_stream = true, .fuse_allreduce = false};
    char *buf = dump_of("tests/data/qwen2moe-gqa", 2, &o);
    int ar_main = 0, ar_aux = 0, shared_aux = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (strstr(line, "ALLREDUCE")) {
            if (strstr(line, " main ")) ar_main++;
            if (strstr(line, " aux ")) ar_aux++;
        }
        if (strstr(line, " aux ") && strstr(line, "LINEAR") && strstr(line, "shared_gu")) shared_aux++;
    }
    cr_expect_eq(ar_aux, 0);
    cr_expect_eq(ar_main, 4 + 1 + 2 * 3, "attention x4, dense mlp x1, routed+shared x3: got %d", ar_main);
    cr_expect_eq(shared_aux, 3);
    free(buf);
}

/* ---- elide_tp1_collectives, fuse_add_rmsnorm ---- */

static int count_op(const msm_graph *g, msm_op op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static msm_graph *apply(const msm_graph *g, const msm_pass_opts *o) {
    msm_graph *out;
    msm_err err = {{0}};
    cr_assert_eq(msm_passes_apply(g, o, &out, &err), 0, "%s", err.msg);
    return out;
}

Test(graph_pass, tp1_collectives_are_elided_in_every_pass_combination) {
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen3moe", "tests/data/mixtral"};
    for (int d = 0; d < 3; d++)
        for (int m = 0; m < 8; m++) {
            msm_graph *g = plain(dirs[d], 1);
            msm_pass_opts o = {.fuse_allreduce = m & 1, .multi_stream = m & 2, .fuse_add_norm = m & 4,
                               .elide_collectives = true};
            msm_graph *p = apply(g, &o); /* plans and verifies */
            cr_expect_eq(count_op(p, MSM_OP_ALLREDUCE) + count_op(p, MSM_OP_ALLGATHER), 0, "%s combo %d", dirs[d], m);
            /* the step outputs are still written */
            bool logits = false;
            for (int i = 0; i < p->n_nodes; i++)
                for (int k = 0; k < p->nodes[i].n_out; k++) logits |= p->nodes[i].out[k] == p->v_logits;
            cr_expect(logits, "%s combo %d: nothing writes the logits", dirs[d], m);
            /* idempotent */
            msm_graph *q, *r;
            msm_err err = {{0}};
            cr_assert_eq(msm_pass_elide_tp1_collectives(p, &o, &q, &err), 0);
            cr_expect(msm_graph_equal(p, q), "elide_tp1_collectives is not idempotent");
            cr_assert_eq(msm_pass_fuse_add_rmsnorm(p, &o, &r, &err), 0);
            if (m & 4) cr_expect(msm_graph_equal(p, r), "fuse_add_rmsnorm is not idempotent");
            msm_graph_free(q), msm_graph_free(r), msm_graph_free(p), msm_graph_free(g);
        }
}

Test(graph_pass, collectives_stay_at_tp2) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 2);
    msm_pass_opts o = {.fuse_allreduce = true, .multi_stream = true, .elide_collectives = true, .fuse_add_norm = true};
    msm_pass_opts o0 = {.fuse_allreduce = true, .multi_stream = true};
    msm_graph *p = apply(g, &o), *p0 = apply(g, &o0);
    cr_expect_eq(count_op(p, MSM_OP_ALLREDUCE), count_op(p0, MSM_OP_ALLREDUCE));
    cr_expect_eq(count_op(p, MSM_OP_ALLGATHER), 1);
    cr_expect_eq(msm_graph_collective_hash(p), msm_graph_collective_hash(p0));
    msm_graph_free(p), msm_graph_free(p0), msm_graph_free(g);
}

Test(graph_pass, moe_combine_fuses_every_gated_shared_layer_in_every_combination) {
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen3moe", "tests/data/mixtral"};
    for (int d = 0; d < 3; d++)
        for (int m = 0; m < 4; m++) {
            msm_graph *g = plain(dirs[d], 1);
            int shared_layers = 0;
            for (int i = 0; i < g->n_nodes; i++)
                shared_layers += g->nodes[i].op == MSM_OP_SIGMOID && g->nodes[i].role == MSM_ROLE_SHARED;
            msm_pass_opts o = {.fuse_allreduce = m & 1, .multi_stream = m & 2, .fuse_add_norm = true,
                               .elide_collectives = true, .fuse_moe_combine = true};
            msm_graph *p = apply(g, &o); /* plans and verifies */
            cr_expect_eq(count_op(p, MSM_OP_MOE_COMBINE_NORM), shared_layers, "%s combo %d", dirs[d], m);
            cr_expect_eq(count_op(p, MSM_OP_SIGMOID), 0, "%s combo %d", dirs[d], m);
            cr_expect_eq(count_op(p, MSM_OP_MUL), 0, "%s combo %d", dirs[d], m);
            /* every residual norm is still fused: ADD_RMSNORM + MOE_COMBINE_NORM = 2 per layer */
            cr_expect_eq(count_op(p, MSM_OP_ADD_RMSNORM) + count_op(p, MSM_OP_MOE_COMBINE_NORM), 2 * g->n_layers);
            /* the shared expert still runs on the aux stream when multi-stream is on */
            int aux_linear = 0;
            for (int i = 0; i < p->n_nodes; i++)
                aux_linear += p->nodes[i].stream == MSM_STREAM_AUX && p->nodes[i].op == MSM_OP_LINEAR &&
                              p->nodes[i].role == MSM_ROLE_SHARED;
            if (m & 2) cr_expect_eq(aux_linear, 2 * shared_layers, "%s combo %d", dirs[d], m);
            msm_graph *q;
            msm_err err = {{0}};
            cr_assert_eq(msm_pass_fuse_moe_combine(p, &o, &q, &err), 0);
            cr_expect(msm_graph_equal(p, q), "fuse_moe_combine is not idempotent");
            msm_graph_free(q), msm_graph_free(p), msm_graph_free(g);
        }
    /* tp 2: an all-reduce sits between the combine and the residual add: the gate, sigmoid, scale
     * and combine fuse into MOE_COMBINE (on MAIN, after the join), the norm stays apart */
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 2);
    msm_pass_opts o = {.fuse_allreduce = true, .multi_stream = true, .elide_collectives = true,
                       .fuse_add_norm = true, .fuse_moe_combine = true};
    msm_graph *p = apply(g, &o);
    cr_expect_eq(count_op(p, MSM_OP_MOE_COMBINE_NORM), 0);
    cr_expect_eq(count_op(p, MSM_OP_MOE_COMBINE), 3); /* sparse_layers */
    cr_expect_eq(count_op(p, MSM_OP_SIGMOID) + count_op(p, MSM_OP_MUL), 0);
    for (int i = 0; i < p->n_nodes; i++)
        if (p->nodes[i].op == MSM_OP_MOE_COMBINE) {
            cr_expect_eq(p->nodes[i].stream, MSM_STREAM_MAIN);
            cr_expect_eq(p->nodes[i - 1].op, MSM_OP_EVENT_WAIT, "MOE_COMBINE must follow the join");
            cr_expect_eq(p->nodes[i + 1].op, MSM_OP_ALLREDUCE);
        }
    msm_graph *q;
    msm_err err = {{0}};
    cr_assert_eq(msm_pass_fuse_moe_combine(p, &o, &q, &err), 0);
    cr_expect(msm_graph_equal(p, q), "fuse_moe_combine is not idempotent at tp 2");
    msm_graph_free(q), msm_graph_free(p), msm_graph_free(g);
}

Test(graph_pass, add_rmsnorm_fuses_both_residual_norms_of_every_layer) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 1);
    msm_pass_opts o = {.fuse_add_norm = true};
    msm_graph *p = apply(g, &o);
    /* per layer: post-attention norm and (next layer's input | final) norm */
    cr_expect_eq(count_op(p, MSM_OP_ADD_RMSNORM), 2 * g->n_layers);
    cr_expect_eq(count_op(p, MSM_OP_RMSNORM), count_op(g, MSM_OP_RMSNORM) - 2 * g->n_layers);
    cr_expect_eq(count_op(p, MSM_OP_ADD), count_op(g, MSM_OP_ADD) - 2 * g->n_layers);
    msm_graph_free(p), msm_graph_free(g);
}

/* ---- fuse_rope_kv_write ---- */

static int count_kv_written(const msm_graph *g) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        n += g->nodes[i].op == MSM_OP_ATTENTION && g->nodes[i].attr.attention.kv_written;
    return n;
}

static msm_graph *pass_rope_kv(const msm_graph *g) {
    msm_graph *out;
    msm_err err = {{0}};
    msm_pass_opts o = {.fuse_rope_kv = true};
    cr_assert_eq(msm_pass_fuse_rope_kv_write(g, &o, &out, &err), 0, "%s", err.msg);
    return out;
}

Test(graph_pass, rope_kv_write_fuses_once_per_layer_in_every_combination) {
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen2moe-mha-tied", "tests/data/qwen3moe",
                          "tests/data/mixtral"};
    for (int d = 0; d < 4; d++)
        for (int tp = 1; tp <= 2; tp++)
            for (int m = 0; m < 4; m++) {
                msm_graph *g = plain(dirs[d], tp);
                msm_pass_opts o = {.fuse_allreduce = m & 1, .multi_stream = m & 2, .fuse_add_norm = true,
                                   .elide_collectives = true, .fuse_moe_combine = true, .fuse_rope_kv = true};
                msm_graph *p = apply(g, &o); /* plans and verifies */
                cr_expect_eq(count_op(p, MSM_OP_ROPE_KV_WRITE), g->n_layers, "%s tp %d combo %d", dirs[d], tp, m);
                cr_expect_eq(count_op(p, MSM_OP_ROPE), 0, "%s tp %d combo %d", dirs[d], tp, m);
                cr_expect_eq(count_kv_written(p), g->n_layers, "%s tp %d combo %d", dirs[d], tp, m);
                cr_expect_gt(p->arena_bytes, 0);
                /* each writer: (qkv, pos, slot) of its layer, read by its layer's ATTENTION next */
                for (int i = 0; i < p->n_nodes; i++) {
                    const msm_node *w = &p->nodes[i], *at = &p->nodes[i + 1];
                    if (w->op != MSM_OP_ROPE_KV_WRITE) continue;
                    cr_expect(w->n_in == 3 && w->in[1] == p->v_pos && w->in[2] == p->v_slot);
                    cr_expect(at->op == MSM_OP_ATTENTION && at->in[0] == w->out[0] && at->layer == w->layer &&
                              at->stream == w->stream, "%s layer %d", dirs[d], w->layer);
                }
                /* idempotent */
                msm_graph *q = pass_rope_kv(p);
                cr_expect(msm_graph_equal(p, q), "fuse_rope_kv_write is not idempotent");
                msm_graph_free(q), msm_graph_free(p), msm_graph_free(g);
            }
}

Test(graph_pass, rope_kv_write_keeps_everything_but_the_rope_and_the_flag) {
    msm_graph *g = plain("tests/data/qwen3moe", 2), *p = pass_rope_kv(g);
    cr_assert_eq(p->n_nodes, g->n_nodes);
    cr_expect_eq(msm_graph_collective_hash(p), msm_graph_collective_hash(g));
    for (int i = 0; i < g->n_nodes; i++) {
        msm_node a = g->nodes[i], b = p->nodes[i];
        if (a.op == MSM_OP_ROPE) {
            cr_expect_eq(b.op, MSM_OP_ROPE_KV_WRITE);
            cr_expect(memcmp(&a.attr, &b.attr, sizeof a.attr) == 0, "theta and heads kept");
            b.op = a.op, b.n_in = a.n_in, b.in[2] = a.in[2];
        } else if (a.op == MSM_OP_ATTENTION) {
            cr_expect_eq(b.attr.attention.kv_written, 1);
            b.attr.attention.kv_written = 0;
        }
        cr_expect(memcmp(&a, &b, sizeof a) == 0, "node %d (%s) changed", i, msm_op_name(a.op));
    }
    msm_graph_free(p), msm_graph_free(g);
}

Test(graph_pass, rope_kv_write_leaves_a_rope_whose_attention_is_on_another_stream) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 1);
    int at = find(g, 0, MSM_OP_ATTENTION, MSM_ROLE_ATTN, 0);
    cr_assert_geq(at, 0);
    g->nodes[at].stream = MSM_STREAM_AUX; /* not a runnable graph: only what the pass matches */
    msm_graph *p = pass_rope_kv(g);
    cr_expect_eq(count_op(p, MSM_OP_ROPE_KV_WRITE), g->n_layers - 1);
    cr_expect_eq(p->nodes[at].attr.attention.kv_written, 0);
    msm_graph_free(p), msm_graph_free(g);
}

static void expect_refused(msm_graph *g, const char *rule, const char *op) {
    msm_err err = {{0}};
    cr_assert_eq(msm_graph_plan(g, &err), 0, "%s", err.msg);
    cr_expect_neq(msm_graph_verify(g, &err), 0, "expected a %s refusal", rule);
    cr_expect(strstr(err.msg, rule) && strstr(err.msg, op), "message: %s", err.msg);
}

Test(graph_verify, refuses_an_attention_that_skips_its_kv_write_after_a_plain_rope) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 1);
    int at = find(g, 2, MSM_OP_ATTENTION, MSM_ROLE_ATTN, 0);
    g->nodes[at].attr.attention.kv_written = 1; /* nothing writes layer 2's cache */
    expect_refused(g, "KV", "ATTENTION");
    msm_graph_free(g);
}

Test(graph_verify, refuses_a_kv_writer_whose_attention_writes_again) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 1), *p = pass_rope_kv(g);
    int at = find(p, 1, MSM_OP_ATTENTION, MSM_ROLE_ATTN, 0);
    p->nodes[at].attr.attention.kv_written = 0;
    expect_refused(p, "KV", "ROPE_KV_WRITE");
    msm_graph_free(p), msm_graph_free(g);
}

Test(graph_verify, refuses_a_kv_writer_of_another_layer) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 1), *p = pass_rope_kv(g);
    int w = find(p, 3, MSM_OP_ROPE_KV_WRITE, MSM_ROLE_ATTN, 0);
    p->nodes[w].layer = 2; /* writes layer 2's cache; layer 3's ATTENTION reads layer 3's */
    expect_refused(p, "KV", "ATTENTION");
    msm_graph_free(p), msm_graph_free(g);
}

/* The cache write is ordered by the writer's output: a ROPE_KV_WRITE forked onto the aux stream
 * whose ATTENTION on main reads it without a join is a V2 refusal, like any cross-stream read. */
Test(graph_verify, refuses_a_kv_writer_on_aux_read_without_a_join) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 1), *p = pass_rope_kv(g);
    int w = find(p, 0, MSM_OP_ROPE_KV_WRITE, MSM_ROLE_ATTN, 0);
    p->nodes[w].stream = MSM_STREAM_AUX;
    int ev = p->n_events++;
    msm_node fork_r = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_MAIN, .layer = 0, .event = ev, .w = {-1, -1, -1}};
    msm_node fork_w = {.op = MSM_OP_EVENT_WAIT, .stream = MSM_STREAM_AUX, .layer = 0, .event = ev, .w = {-1, -1, -1}};
    msm_graph_insert(p, w, &fork_w); /* the writer's own read of qkv is covered */
    msm_graph_insert(p, w, &fork_r);
    expect_refused(p, "V2", "ATTENTION");
    msm_graph_free(p), msm_graph_free(g);
}

Test(graph_dump, shows_the_rope_kv_write_and_named_attributes) {
    msm_pass_opts o = {.fuse_rope_kv = true};
    char *buf = dump_of("tests/data/qwen3moe", 1, &o);
    cr_expect(strstr(buf, "ROPE_KV_WRITE    qkv_norm0, pos, slot -> qkv_rope0 [nh=8 kvh=4 hd=16 theta=10000]"),
              "dump:\n%s", buf);
    cr_expect(strstr(buf, "ATTENTION        qkv_rope0, seq, pos, slot, block_tables -> attn0 [nh=8 kvh=4 hd=16 "
                          "scale=0.25 kv_written=1]"), "dump:\n%s", buf);
    cr_expect(strstr(buf, "LINEAR           attn_in0 -> qkv0 [N=256 K=64]"), "dump:\n%s", buf);
    free(buf);
}

/* ---- GLM-4.5: the group-limited router op and the ungated shared expert ---- */

/* glm4moe: 4 layers, layer 0 dense (first_k_dense_replace 1), 16 experts in 4 groups (2 kept),
 * top-4, 2 shared experts without a gate, partial RoPE (8 of 16 dims) */
static const int glm_sparse[] = {1, 2, 3};

Test(graph_build, glm_router_is_one_group_topk_node_reading_its_f32_bias) {
    msm_graph *g = plain("tests/data/glm4moe", 2);
    cr_expect_eq(count_op(g, MSM_OP_ROUTER_TOPK), 0);
    cr_expect_eq(count_op(g, MSM_OP_ROUTER_GROUP_TOPK), 3, "one router per MoE layer");
    cr_expect_eq(find(g, 0, MSM_OP_ROUTER_GROUP_TOPK, MSM_ROLE_ROUTED, 0), -1, "layer 0 is dense");
    for (int k = 0; k < 3; k++) {
        int L = glm_sparse[k], r = find(g, L, MSM_OP_ROUTER_GROUP_TOPK, MSM_ROLE_ROUTED, 0);
        cr_assert_geq(r, 0, "layer %d", L);
        const msm_node *n = &g->nodes[r];
        const msm_attr_router_group *a = &n->attr.router_group;
        cr_expect(a->E == 16 && a->k == 4 && a->n_group == 4 && a->topk_group == 2 && a->norm == 1 &&
                  a->scale == 2.5f, "layer %d attributes", L);
        /* it reads the router LINEAR's logits and writes the ids and weights MOE_EXPERTS reads */
        int lin = find(g, L, MSM_OP_LINEAR, MSM_ROLE_ROUTED, 0), moe = find(g, L, MSM_OP_MOE_EXPERTS, MSM_ROLE_ROUTED, 0);
        cr_assert(lin >= 0 && lin < r && moe > r);
        cr_expect_eq(n->in[0], g->nodes[lin].out[0]);
        cr_expect(g->nodes[moe].in[1] == n->out[0] && g->nodes[moe].in[2] == n->out[1]);
        /* the selection bias: a replicated float32 weight from the checkpoint's buffer */
        cr_assert_geq(n->w[0], 0);
        const msm_weight *w = &g->weights[n->w[0]];
        char want[96];
        snprintf(want, sizeof want, "model.layers.%d.mlp.gate.e_score_correction_bias", L);
        cr_expect(w->keep_f32 && !w->is_norm && w->n_expert == 1 && w->rows == 16 && w->cols == 1);
        cr_expect(w->n_parts == 1 && strcmp(w->parts[0].src, want) == 0, "bias source %s", w->parts[0].src);
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == MSM_OP_ROPE) cr_expect(g->nodes[i].attr.rope.rot == 8 && g->nodes[i].attr.rope.hd == 16);
    msm_graph_free(g);
}

Test(graph_pass, glm_ungated_shared_expert_goes_to_aux_with_its_allreduce_on_main) {
    msm_graph *g = plain("tests/data/glm4moe", 2);
    msm_pass_opts o = {.multi_stream = true};
    msm_graph *m = pass_ms(g, &o);
    cr_expect_eq(m->n_events, 6, "two events per MoE layer, none for the dense one");
    for (int k = 0; k < 3; k++) {
        int L = glm_sparse[k];
        int ar = find(m, L, MSM_OP_ALLREDUCE, MSM_ROLE_SHARED, 0), first_routed = find(m, L, MSM_OP_LINEAR, MSM_ROLE_ROUTED, 0);
        cr_assert(ar >= 0 && first_routed >= 0);
        cr_expect_eq(m->nodes[ar].stream, MSM_STREAM_MAIN);
        int n_aux = 0;
        for (int i = 0; i < m->n_nodes; i++) {
            const msm_node *n = &m->nodes[i];
            if (n->layer != L || n->stream != MSM_STREAM_AUX || n->op == MSM_OP_EVENT_WAIT || n->op == MSM_OP_EVENT_RECORD)
                continue;
            n_aux++;
            cr_expect_eq(n->role, MSM_ROLE_SHARED);
            cr_expect_lt(i, first_routed, "layer %d: aux node issued after the routed work", L);
        }
        cr_expect_eq(n_aux, 3, "layer %d: gate_up, swiglu, down on aux (no gate): got %d", L, n_aux);
    }
    cr_expect_eq(count(m, 0, MSM_OP_EVENT_RECORD, MSM_STREAM_MAIN), 0, "the dense layer has no fork");
    verify_ok(m);
    msm_graph_free(m), msm_graph_free(g);
}

/* ALLREDUCE(routed) + ALLREDUCE(shared) -> ALLREDUCE(routed + shared): the combine ADD reads both
 * partial sums and one all-reduce on main writes the layer's MoE output; with multi-stream on too
 * the whole shared branch runs on aux and the single collective follows the join. */
Test(graph_pass, glm_ungated_shared_allreduce_fuses_with_the_routed_one) {
    msm_graph *g = plain("tests/data/glm4moe", 2), *f = pass_fuse(g);
    cr_expect_eq(count_op(g, MSM_OP_ALLREDUCE) - count_op(f, MSM_OP_ALLREDUCE), 3);
    for (int k = 0; k < 3; k++) {
        int L = glm_sparse[k];
        cr_expect_eq(find(f, L, MSM_OP_ALLREDUCE, MSM_ROLE_SHARED, 0), -1);
        cr_expect_eq(find(f, L, MSM_OP_ALLREDUCE, MSM_ROLE_ROUTED, 0), -1);
        int add = find(f, L, MSM_OP_ADD, MSM_ROLE_MOE_COMBINE, 0), ar = find(f, L, MSM_OP_ALLREDUCE, MSM_ROLE_MOE_COMBINE, 0);
        cr_assert(add >= 0 && ar == add + 1, "layer %d: the fused all-reduce follows the combine", L);
        int moe = find(f, L, MSM_OP_MOE_EXPERTS, MSM_ROLE_ROUTED, 0), down = -1;
        for (int i = 0; i < f->n_nodes; i++)
            if (f->nodes[i].layer == L && f->nodes[i].op == MSM_OP_LINEAR && f->nodes[i].role == MSM_ROLE_SHARED) down = i;
        cr_assert(moe >= 0 && down >= 0);
        cr_expect(f->nodes[add].in[0] == f->nodes[moe].out[0] && f->nodes[add].in[1] == f->nodes[down].out[0],
                  "layer %d: the combine reads the two partial sums", L);
        cr_expect_eq(f->nodes[ar].in[0], f->nodes[add].out[0]);
    }
    verify_ok(f);
    msm_pass_opts o = {.multi_stream = true};
    msm_graph *fm = pass_ms(f, &o), *f2 = pass_fuse(f), *fm2 = pass_ms(fm, &o);
    cr_expect(msm_graph_equal(f, f2), "fuse_moe_allreduce is not idempotent");
    cr_expect(msm_graph_equal(fm, fm2), "multi_stream_moe is not idempotent");
    for (int k = 0; k < 3; k++) {
        int L = glm_sparse[k];
        cr_expect_eq(count(fm, L, MSM_OP_LINEAR, MSM_STREAM_AUX), 2);
        cr_expect_eq(count(fm, L, MSM_OP_ALLREDUCE, MSM_STREAM_MAIN), 2, "attention + the fused MoE one");
        cr_expect_eq(count(fm, L, MSM_OP_ALLREDUCE, MSM_STREAM_AUX), 0);
    }
    verify_ok(fm);
    msm_graph_free(fm), msm_graph_free(fm2), msm_graph_free(f2), msm_graph_free(f), msm_graph_free(g);
}

/* fuse_moe_combine is the gated combine's fusion: an ungated shared expert has no MUL to match, so
 * at tp 1 with every pass on the combine stays an ADD before the ADD_RMSNORM. */
Test(graph_pass, moe_combine_leaves_an_ungated_shared_expert_alone) {
    for (int m = 0; m < 4; m++) {
        msm_graph *g = plain("tests/data/glm4moe", 1);
        msm_pass_opts o = {.fuse_allreduce = m & 1, .multi_stream = m & 2, .fuse_add_norm = true,
                           .elide_collectives = true, .fuse_moe_combine = true, .fuse_rope_kv = true};
        msm_graph *p = apply(g, &o); /* plans and verifies */
        cr_expect_eq(count_op(p, MSM_OP_MOE_COMBINE_NORM), 0, "combo %d", m);
        cr_expect_eq(count_op(p, MSM_OP_ADD), 3, "combo %d: one combine ADD per MoE layer", m);
        cr_expect_eq(count_op(p, MSM_OP_ADD_RMSNORM), 2 * g->n_layers, "combo %d", m);
        cr_expect_eq(count_op(p, MSM_OP_ROPE_KV_WRITE), g->n_layers, "combo %d", m);
        msm_graph_free(p), msm_graph_free(g);
    }
}

Test(graph_dump, shows_the_group_router_and_partial_rope_attributes) {
    msm_pass_opts o = {.fuse_rope_kv = true};
    char *buf = dump_of("tests/data/glm4moe", 1, &o);
    cr_expect(strstr(buf, "ROUTER_GROUP_TOPK router1 -> topk_ids1, topk_w1 [E=16 k=4 n_group=4 topk_group=2 "
                          "norm=1 scale=2.5]"), "dump:\n%s", buf);
    cr_expect(strstr(buf, "ROPE_KV_WRITE    qkv_norm0, pos, slot -> qkv_rope0 [nh=8 kvh=4 hd=16 theta=10000 rot=8]"),
              "dump:\n%s", buf);
    free(buf);
}

/* The GLM-4.5-Air shape preset (msmoe-bench's dummy-weights model) builds, passes and verifies at
 * every TP size that divides its heads: 46 layers, layer 0 dense, 45 MoE layers each with one
 * group router and an ungated shared expert on the aux stream. */
Test(graph_build, glm45_air_preset_builds_and_verifies_at_every_tp) {
    const int tps[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        msm_graph *g = plain("config/models/glm-4.5-air.json", tps[i]);
        cr_expect_eq(count_op(g, MSM_OP_ROUTER_GROUP_TOPK), 45, "tp %d", tps[i]);
        msm_pass_opts o = {.fuse_allreduce = true, .multi_stream = true, .fuse_add_norm = true,
                           .elide_collectives = true, .fuse_moe_combine = true, .fuse_rope_kv = true};
        msm_graph *p = apply(g, &o); /* plans and verifies */
        cr_expect_eq(p->n_events, 2 * 45, "tp %d: a fork and a join per MoE layer", tps[i]);
        cr_expect_eq(count_op(p, MSM_OP_ALLREDUCE), tps[i] == 1 ? 0 : 46 + 46, "tp %d: attention + one per MLP", tps[i]);
        for (int n = 0; n < p->n_nodes; n++)
            if (p->nodes[n].op == MSM_OP_ROPE_KV_WRITE) cr_expect_eq(p->nodes[n].attr.rope.rot, 64);
        msm_graph_free(p), msm_graph_free(g);
    }
}

/* tp 2: every all-reduce followed by the residual add + norm becomes one ALLREDUCE_ADD_RMSNORM
 * (two per layer with the MoE all-reduces fused, every model, with and without multi-stream): the
 * collective sequence keeps its length and place (V4's hash differs only by the op), the pass is
 * idempotent, and the verifier holds the fused node to V1 like any collective. */
Test(graph_pass, allreduce_add_rmsnorm_fuses_every_residual_allreduce) {
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen3moe", "tests/data/mixtral", "tests/data/glm4moe"};
    for (int d = 0; d < 4; d++)
        for (int m = 0; m < 2; m++) {
            msm_graph *g = plain(dirs[d], 2);
            msm_pass_opts o0 = {.fuse_allreduce = true, .multi_stream = m, .elide_collectives = true,
                                .fuse_add_norm = true, .fuse_moe_combine = true, .fuse_rope_kv = true};
            msm_pass_opts o = o0;
            o.fuse_allreduce_norm = true;
            msm_graph *p0 = apply(g, &o0), *p = apply(g, &o);
            cr_expect_eq(count_op(p, MSM_OP_ALLREDUCE_ADD_RMSNORM), 2 * g->n_layers, "%s ms %d", dirs[d], m);
            cr_expect_eq(count_op(p, MSM_OP_ALLREDUCE), 0, "%s ms %d", dirs[d], m);
            cr_expect_eq(count_op(p, MSM_OP_ADD_RMSNORM), count_op(p0, MSM_OP_ADD_RMSNORM) - 2 * g->n_layers);
            cr_expect_eq(count_op(p0, MSM_OP_ALLREDUCE), 2 * g->n_layers);
            int c0 = 0, c = 0;
            for (int i = 0; i < p0->n_nodes; i++) c0 += msm_op_is_collective(p0->nodes[i].op);
            for (int i = 0; i < p->n_nodes; i++) c += msm_op_is_collective(p->nodes[i].op);
            cr_expect_eq(c, c0, "%s: the collective sequence changed length", dirs[d]);
            msm_graph *q;
            msm_err err = {{0}};
            cr_assert_eq(msm_pass_fuse_allreduce_add_rmsnorm(p, &o, &q, &err), 0);
            cr_expect(msm_graph_equal(p, q), "fuse_allreduce_add_rmsnorm is not idempotent");
            /* moved to aux: V1 */
            for (int i = 0; i < q->n_nodes; i++)
                if (q->nodes[i].op == MSM_OP_ALLREDUCE_ADD_RMSNORM) {
                    q->nodes[i].stream = MSM_STREAM_AUX;
                    break;
                }
            cr_expect_neq(msm_graph_verify(q, &err), 0);
            cr_expect(strstr(err.msg, "V1") && strstr(err.msg, "ALLREDUCE_ADD_RMSNORM"), "message: %s", err.msg);
            msm_graph_free(q), msm_graph_free(p), msm_graph_free(p0), msm_graph_free(g);
        }
    /* tp 1: the collectives are elided first, nothing is left to fuse */
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 1);
    msm_pass_opts o = {.fuse_allreduce = true, .elide_collectives = true, .fuse_add_norm = true,
                       .fuse_allreduce_norm = true};
    msm_graph *p = apply(g, &o);
    cr_expect_eq(count_op(p, MSM_OP_ALLREDUCE_ADD_RMSNORM), 0);
    msm_graph_free(p), msm_graph_free(g);
}

/* The router LINEAR + ROUTER_TOPK of every softmax-routed MoE layer → one ROUTER_LINEAR_TOPK, at
 * tp 1 and 2, idempotent; GLM-4.5's group router is left alone. */
Test(graph_pass, router_linear_topk_fuses_every_softmax_router) {
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen3moe", "tests/data/mixtral", "tests/data/glm4moe"};
    for (int d = 0; d < 4; d++)
        for (int tp = 1; tp <= 2; tp++) {
            msm_graph *g = plain(dirs[d], tp);
            int routers = count_op(g, MSM_OP_ROUTER_TOPK);
            msm_pass_opts o = {.fuse_allreduce = true, .multi_stream = true, .elide_collectives = true,
                               .fuse_add_norm = true, .fuse_router = true};
            msm_graph *p = apply(g, &o);
            cr_expect_eq(count_op(p, MSM_OP_ROUTER_LINEAR_TOPK), routers, "%s tp %d", dirs[d], tp);
            cr_expect_eq(count_op(p, MSM_OP_ROUTER_TOPK), 0, "%s tp %d", dirs[d], tp);
            cr_expect_eq(count_op(p, MSM_OP_LINEAR), count_op(g, MSM_OP_LINEAR) - routers, "%s tp %d", dirs[d], tp);
            if (d == 3) cr_expect_gt(count_op(p, MSM_OP_ROUTER_GROUP_TOPK), 0);
            msm_graph *q;
            msm_err err = {{0}};
            cr_assert_eq(msm_pass_fuse_router_topk(p, &o, &q, &err), 0);
            cr_expect(msm_graph_equal(p, q), "fuse_router_topk is not idempotent");
            msm_graph_free(q), msm_graph_free(p), msm_graph_free(g);
        }
}

/* A LINEAR and the ADD_RMSNORM of its output (o_proj and every dense MLP's down at tp 1) → one
 * LINEAR_ADD_RMSNORM: every layer's o_proj at least, none left adjacent, idempotent; at tp 2 an
 * all-reduce sits between them (fuse_allreduce_add_rmsnorm takes those), so nothing fuses. */
Test(graph_pass, linear_add_rmsnorm_fuses_every_tp1_projection) {
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen3moe", "tests/data/mixtral", "tests/data/glm4moe"};
    for (int d = 0; d < 4; d++)
        for (int tp = 1; tp <= 2; tp++) {
            msm_graph *g = plain(dirs[d], tp);
            msm_pass_opts o = {.fuse_allreduce = true, .multi_stream = true, .elide_collectives = true,
                               .fuse_add_norm = true, .fuse_moe_combine = true, .fuse_allreduce_norm = true,
                               .fuse_router = true, .fuse_linear_norm = true, .fuse_rope_kv = true};
            msm_graph *p = apply(g, &o);
            int fused = count_op(p, MSM_OP_LINEAR_ADD_RMSNORM);
            if (tp == 1)
                cr_expect_geq(fused, g->n_layers, "%s: %d fused of %d layers", dirs[d], fused, g->n_layers);
            else
                cr_expect_eq(fused, 0, "%s tp 2", dirs[d]);
            for (int i = 0; i + 1 < p->n_nodes; i++) {
                const msm_node *a = &p->nodes[i], *b = &p->nodes[i + 1];
                bool pair = a->op == MSM_OP_LINEAR && b->op == MSM_OP_ADD_RMSNORM && b->stream == a->stream &&
                            (b->in[0] == a->out[0] || b->in[1] == a->out[0]);
                cr_expect(!pair, "%s tp %d: node %d LINEAR + ADD_RMSNORM left unfused", dirs[d], tp, i);
            }
            for (int i = 0; i < p->n_nodes; i++)
                if (p->nodes[i].op == MSM_OP_LINEAR_ADD_RMSNORM) {
                    const msm_node *n = &p->nodes[i];
                    cr_expect(n->n_in == 2 && n->n_out == 2 && n->w[0] >= 0 && n->w[2] >= 0, "%s node %d", dirs[d], i);
                    cr_expect_eq(g->vals[n->in[1]].cols, n->attr.linear_norm.N);
                    /* the backends write the product into the sum's bytes before they read x and r: the
                     * planner must never let the sum share bytes with them */
                    const msm_value *sv = &p->vals[n->out[0]];
                    for (int j = 0; j < 2; j++) {
                        const msm_value *iv = &p->vals[n->in[j]];
                        bool apart = sv->offset + msm_value_bytes_max(p, sv) <= iv->offset ||
                                     iv->offset + msm_value_bytes_max(p, iv) <= sv->offset;
                        cr_expect(apart, "%s node %d: the sum overlaps input %d", dirs[d], i, j);
                    }
                }
            msm_graph *q;
            msm_err err = {{0}};
            cr_assert_eq(msm_pass_fuse_linear_add_rmsnorm(p, &o, &q, &err), 0);
            cr_expect(msm_graph_equal(p, q), "fuse_linear_add_rmsnorm is not idempotent");
            msm_graph_free(q), msm_graph_free(p), msm_graph_free(g);
        }
}

/* ---- prefetch_l2 ---- */

static const char *wname(const msm_graph *g, int wi) { return wi >= 0 ? g->weights[wi].name : "-"; }

/* Checks every layer of out (passes with prefetch_l2 applied to a tp-1 graph): one PREFETCH on
 * AUX, right after a WAIT on AUX of the event the node before it RECORDed on MAIN, right before the
 * layer's ATTENTION; its weights: the o_proj first, then (when `mlp`) the layer's shared expert's or
 * dense MLP's gate_up and down; never a routed expert's, a router or a norm; then one join at the
 * end. */
static void check_prefetch(const msm_graph *out, bool mlp) {
    for (int L = 0; L < out->n_layers; L++) {
        cr_assert_eq(count(out, L, MSM_OP_PREFETCH, MSM_STREAM_AUX), 1, "layer %d", L);
        cr_assert_eq(count(out, L, MSM_OP_PREFETCH, MSM_STREAM_MAIN), 0, "layer %d", L);
        int p = -1;
        for (int i = 0; i < out->n_nodes && p < 0; i++)
            if (out->nodes[i].layer == L && out->nodes[i].op == MSM_OP_PREFETCH) p = i;
        cr_assert(p >= 2 && p + 1 < out->n_nodes);
        const msm_node *rec = &out->nodes[p - 2], *wt = &out->nodes[p - 1], *pf = &out->nodes[p];
        cr_expect(rec->op == MSM_OP_EVENT_RECORD && rec->stream == MSM_STREAM_MAIN, "layer %d: no fork", L);
        cr_expect(wt->op == MSM_OP_EVENT_WAIT && wt->stream == MSM_STREAM_AUX && wt->event == rec->event);
        cr_expect(out->nodes[p + 1].op == MSM_OP_ATTENTION && out->nodes[p + 1].layer == L,
                  "layer %d: the PREFETCH is not right before the attention", L);
        cr_expect(strstr(wname(out, pf->w[0]), "o_proj"), "layer %d: first weight %s", L, wname(out, pf->w[0]));
        if (mlp) {
            cr_expect(strstr(wname(out, pf->w[1]), "_gate_up") && !strstr(wname(out, pf->w[1]), "experts"),
                      "layer %d: second weight %s", L, wname(out, pf->w[1]));
            cr_expect(strstr(wname(out, pf->w[2]), "_down") && !strstr(wname(out, pf->w[2]), "experts"),
                      "layer %d: third weight %s", L, wname(out, pf->w[2]));
        } else {
            cr_expect_eq(pf->w[1], -1, "layer %d: %s", L, wname(out, pf->w[1]));
        }
        for (int j = 0; j < MSM_NODE_MAX_W; j++)
            cr_expect(pf->w[j] < 0 || !out->weights[pf->w[j]].is_norm, "layer %d: a norm", L);
    }
    const msm_node *a = &out->nodes[out->n_nodes - 2], *b = &out->nodes[out->n_nodes - 1];
    cr_expect(a->op == MSM_OP_EVENT_RECORD && a->stream == MSM_STREAM_AUX, "no final join");
    cr_expect(b->op == MSM_OP_EVENT_WAIT && b->stream == MSM_STREAM_MAIN && b->event == a->event);
}

static const msm_pass_opts all_on = {.multi_stream = true, .elide_collectives = true, .fuse_add_norm = true,
                                     .fuse_moe_combine = true, .fuse_rope_kv = true, .fuse_allreduce_norm = true,
                                     .fuse_router = true, .router_first = true, .prefetch_l2 = true};

Test(graph_pass, prefetch_l2_forks_each_attention_and_takes_o_proj_and_the_shared_expert) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 1), *out = apply(g, &all_on);
    check_prefetch(out, true); /* layer 1 is dense: its MLP's weights */
    msm_graph_free(out);
    msm_graph_free(g);
    /* a model without a shared expert: the o_proj alone (the rest of its layer is the router's) */
    g = plain("tests/data/qwen3moe", 1), out = apply(g, &all_on);
    check_prefetch(out, false);
    msm_graph_free(out);
    msm_graph_free(g);
}

Test(graph_pass, prefetch_l2_is_idempotent_and_off_without_multi_stream) {
    msm_graph *g = plain("tests/data/qwen2moe-gqa", 2), *p1, *p2;
    msm_err err = {{0}};
    cr_assert_eq(msm_pass_prefetch_l2(g, &all_on, &p1, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_pass_prefetch_l2(p1, &all_on, &p2, &err), 0, "%s", err.msg);
    cr_expect(msm_graph_equal(p1, p2), "prefetch_l2 is not idempotent");
    cr_expect_eq(count_op(p1, MSM_OP_PREFETCH), 4);
    msm_pass_opts one = all_on;
    one.multi_stream = false;
    msm_graph *s = apply(g, &one);
    cr_expect_eq(count_op(s, MSM_OP_PREFETCH), 0, "the one-stream graph got a PREFETCH");
    for (int i = 0; i < s->n_nodes; i++) cr_expect_eq(s->nodes[i].stream, MSM_STREAM_MAIN);
    msm_graph *list[] = {g, p1, p2, s};
    for (int i = 0; i < 4; i++) msm_graph_free(list[i]);
}

Test(graph_pass, prefetch_l2_keeps_every_other_node_and_the_collectives_on_main) {
    msm_graph *g = plain("tests/data/glm4moe", 2);
    msm_pass_opts without = all_on;
    without.prefetch_l2 = false;
    msm_graph *a = apply(g, &without), *b = apply(g, &all_on);
    /* b is a with, per layer, RECORD + WAIT + PREFETCH before the ATTENTION, and the final join:
     * the events b has beyond a's */
    cr_assert_eq(b->n_nodes, a->n_nodes + 3 * a->n_layers + 2);
    cr_assert_eq(b->n_events, a->n_events + a->n_layers + 1);
    int j = 0;
    for (int i = 0; i < a->n_nodes; i++, j++) {
        for (; j < b->n_nodes; j++) {
            const msm_node *x = &b->nodes[j];
            bool ev = x->op == MSM_OP_EVENT_RECORD || x->op == MSM_OP_EVENT_WAIT;
            if (!(x->op == MSM_OP_PREFETCH || (ev && x->event >= a->n_events))) break;
        }
        cr_assert_lt(j, b->n_nodes);
        cr_assert_eq(a->nodes[i].op, b->nodes[j].op, "node %d vs %d", i, j);
        cr_expect_eq(a->nodes[i].stream, b->nodes[j].stream, "node %d", i);
        cr_expect_eq(a->nodes[i].event, b->nodes[j].event, "node %d", i);
        if (msm_op_is_collective(b->nodes[j].op)) cr_expect_eq(b->nodes[j].stream, MSM_STREAM_MAIN);
    }
    cr_expect_eq(j + 2, b->n_nodes, "only the final join after the last common node");
    cr_expect_eq(msm_graph_collective_hash(a), msm_graph_collective_hash(b));
    msm_graph_free(a);
    msm_graph_free(b);
    msm_graph_free(g);
}

Test(graph_dump, shows_the_prefetch_and_its_weights) {
    char *buf = dump_of("tests/data/qwen3moe", 1, &all_on);
    int n = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
        n += strstr(line, " aux ") && strstr(line, "PREFETCH") && strstr(line, "o_proj]");
    cr_expect_eq(n, 4, "one PREFETCH a layer of the 4, naming its o_proj: %d", n);
    free(buf);
}

/* prefetch_l2_next: in a layer with nothing on AUX (no shared expert), a second PREFETCH right before
 * the router, of the next layer's qkv; never in the last layer, nor where a shared expert runs. */
Test(graph_pass, prefetch_l2_next_takes_the_next_qkv_at_the_router_without_a_shared_expert) {
    msm_pass_opts o = all_on;
    o.prefetch_l2_next = true;
    msm_graph *g = plain("tests/data/qwen3moe", 1), *out = apply(g, &o);
    for (int L = 0; L < out->n_layers; L++) {
        int want = L + 1 < out->n_layers ? 2 : 1;
        cr_assert_eq(count(out, L, MSM_OP_PREFETCH, MSM_STREAM_AUX), want, "layer %d", L);
        if (want == 1) continue;
        int p = -1;
        for (int i = 0; i < out->n_nodes; i++)
            if (out->nodes[i].layer == L && out->nodes[i].op == MSM_OP_PREFETCH) p = i; /* the last: the router's */
        cr_assert(p >= 2 && p + 1 < out->n_nodes);
        const msm_node *pf = &out->nodes[p], *nx = &out->nodes[p + 1];
        cr_expect(out->nodes[p - 2].op == MSM_OP_EVENT_RECORD && out->nodes[p - 1].op == MSM_OP_EVENT_WAIT);
        cr_expect(nx->layer == L && nx->role == MSM_ROLE_ROUTED && nx->stream == MSM_STREAM_MAIN,
                  "layer %d: not right before the router (%s)", L, msm_op_name(nx->op));
        char want_w[64];
        snprintf(want_w, sizeof want_w, "layers.%d.qkv", L + 1);
        cr_expect_str_eq(wname(out, pf->w[0]), want_w, "layer %d", L);
        cr_expect_eq(pf->w[1], -1, "layer %d: only the qkv (the q/k norms are small): %s", L, wname(out, pf->w[1]));
    }
    msm_graph *again;
    msm_err err = {{0}};
    cr_assert_eq(msm_pass_prefetch_l2(out, &o, &again, &err), 0, "%s", err.msg);
    cr_expect(msm_graph_equal(out, again), "prefetch_l2 with next is not idempotent");
    msm_graph_free(again);
    msm_graph_free(out);
    msm_graph_free(g);
    /* with a shared expert on AUX (and in the dense layer, which has no router): one a layer */
    g = plain("tests/data/qwen2moe-gqa", 1), out = apply(g, &o);
    check_prefetch(out, true);
    msm_graph_free(out);
    msm_graph_free(g);
}

/* prefetch_kv: the PREFETCH_KV of each layer computing nothing on AUX (the step's seq, pos and block
 * tables; its ATTENTION's kvh and hd) on AUX, forked right before the norm its qkv projection reads,
 * which stays right before that projection (the CUDA backend runs the pair as one kernel); none in a
 * layer with a shared expert on AUX; alone, the only change. The experts' sum keeps the norm as its
 * reader across the fork (the CUDA backend's combine inside it). */
Test(graph_pass, prefetch_kv_forks_before_each_qkv_norm_and_keeps_the_norm_linear_pair) {
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen3moe", "tests/data/glm4moe"};
    for (int d = 0; d < 3; d++) {
        msm_graph *g = plain(dirs[d], d == 2 ? 2 : 1);
        msm_pass_opts kv = all_on, none = all_on;
        kv.prefetch_l2 = false, kv.prefetch_kv = true, none.prefetch_l2 = false;
        msm_graph *a = apply(g, &none), *b = apply(g, &kv), *again;
        int forks = 0;
        bool aux[64] = {false};
        cr_assert_leq(a->n_layers, 64);
        for (int i = 0; i < a->n_nodes; i++) {
            const msm_node *x = &a->nodes[i];
            if (x->layer >= 0 && x->stream == MSM_STREAM_AUX && x->op != MSM_OP_EVENT_WAIT &&
                x->op != MSM_OP_EVENT_RECORD)
                aux[x->layer] = true;
        }
        for (int L = 0; L < a->n_layers; L++) forks += !aux[L];
        cr_assert_eq(b->n_nodes, a->n_nodes + 3 * forks + (forks ? 2 : 0), "%s", dirs[d]);
        cr_expect_eq(count_op(b, MSM_OP_PREFETCH), 0);
        cr_expect(d != 1 || forks == b->n_layers, "qwen3moe (no shared expert): a fork in every layer");
        cr_expect(d != 0 || forks < b->n_layers, "qwen2moe-gqa: its shared experts' layers have none");
        for (int L = 0; L < b->n_layers; L++) {
            cr_assert_eq(count(b, L, MSM_OP_PREFETCH_KV, MSM_STREAM_AUX), !aux[L], "%s layer %d", dirs[d], L);
            if (aux[L]) continue;
            int p = -1, att = -1, lin = -1;
            for (int i = 0; i < b->n_nodes; i++) {
                const msm_node *x = &b->nodes[i];
                if (x->layer == L && x->op == MSM_OP_PREFETCH_KV) p = i;
                if (x->layer == L && x->op == MSM_OP_ATTENTION && att < 0) att = i;
                if (x->layer == L && x->op == MSM_OP_LINEAR && x->stream == MSM_STREAM_MAIN && lin < 0) lin = i;
            }
            const msm_node *pf = &b->nodes[p], *norm = &b->nodes[p + 1];
            cr_expect(b->nodes[p - 2].op == MSM_OP_EVENT_RECORD && b->nodes[p - 1].op == MSM_OP_EVENT_WAIT &&
                      b->nodes[p - 1].event == b->nodes[p - 2].event);
            cr_expect(pf->n_in == 3 && pf->in[0] == b->v_seq && pf->in[1] == b->v_pos && pf->in[2] == b->v_btab);
            cr_expect(pf->attr.attention.kvh == b->nodes[att].attr.attention.kvh &&
                      pf->attr.attention.hd == b->nodes[att].attr.attention.hd);
            cr_expect_eq(p + 2, lin, "%s layer %d: the norm and its qkv projection no longer adjacent", dirs[d], L);
            bool feeds = false;
            for (int j = 0; j < norm->n_out; j++) feeds |= norm->out[j] == b->nodes[lin].in[0];
            cr_expect(feeds, "%s layer %d: the node after the PREFETCH_KV is not the qkv input's producer", dirs[d], L);
        }
        /* the experts' sum keeps its reader (the CUDA backend's combine inside the norm) past the fork,
         * and the reader its source */
        int ra = 0, rb = 0;
        for (int i = 0, j = 0; i < a->n_nodes; i++) {
            if (a->nodes[i].op != MSM_OP_MOE_EXPERTS) continue;
            while (j < b->n_nodes && !(b->nodes[j].op == MSM_OP_MOE_EXPERTS && b->nodes[j].layer == a->nodes[i].layer &&
                                       b->nodes[j].stream == a->nodes[i].stream))
                j++;
            cr_assert_lt(j, b->n_nodes, "%s: a MOE_EXPERTS node is gone", dirs[d]);
            int x = msm_graph_moe_sum_reader(a, i), y = msm_graph_moe_sum_reader(b, j);
            ra += x >= 0, rb += y >= 0;
            /* and the reader finds its experts back across the fork (the CUDA backend's combine
             * inside the norm asks from the reader's side: a reader that did not would read a sum
             * the experts never wrote) */
            if (x >= 0) cr_expect_eq(msm_graph_moe_sum_source(a, x), i, "%s layer %d", dirs[d], a->nodes[i].layer);
            if (y >= 0)
                cr_expect_eq(msm_graph_moe_sum_source(b, y), j, "%s layer %d: the reader %d does not find its experts",
                             dirs[d], a->nodes[i].layer, y);
            cr_expect((x < 0) == (y < 0), "%s layer %d: the sum's reader %d without the fork, %d with it", dirs[d],
                      a->nodes[i].layer, x, y);
            if (x >= 0 && y >= 0)
                cr_expect(a->nodes[x].op == b->nodes[y].op && a->nodes[x].out[0] == b->nodes[y].out[0], "%s layer %d",
                          dirs[d], a->nodes[i].layer);
            j++;
        }
        if (d < 2) cr_expect_gt(ra, 0, "%s: no experts' sum read by the norm after it", dirs[d]); /* TP 2: an all-reduce */
        cr_expect_eq(ra, rb, "%s", dirs[d]);
        msm_err err = {{0}};
        cr_assert_eq(msm_pass_prefetch_l2(b, &kv, &again, &err), 0, "%s", err.msg);
        cr_expect(msm_graph_equal(b, again), "%s: prefetch_kv is not idempotent", dirs[d]);
        msm_graph *list[] = {g, a, b, again};
        for (int i = 0; i < 4; i++) msm_graph_free(list[i]);
    }
}

/* fork_before_norm: in every layer with a shared expert (qwen2moe-gqa's, glm4moe's ungated one), the
 * fork's RECORD sits right before the residual ADD_RMSNORM on MAIN, which stays right before the
 * router; the AUX branch starts with a copy of that norm (the same op, inputs, weight and
 * attributes; fresh outputs of the same shapes) and its readers read the copy's norm; nothing else
 * changes (the same node count but one a layer). The plan keeps the copy's inputs and outputs off
 * every byte the main stream writes in the fork's window; idempotent; off without multi_stream; at
 * tp 2, where the norm rides in the all-reduce (fuse_allreduce_add_rmsnorm), nothing to move. */
Test(graph_pass, fork_before_norm_gives_the_shared_branch_its_own_norm) {
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/glm4moe", "tests/data/qwen3moe"};
    for (int d = 0; d < 3; d++) {
        msm_graph *g = plain(dirs[d], 1);
        msm_pass_opts on = all_on, off = all_on;
        on.prefetch_l2 = off.prefetch_l2 = false, on.fork_before_norm = true;
        msm_graph *a = apply(g, &off), *b = apply(g, &on), *again;
        int forks = 0;
        for (int L = 0; L < a->n_layers; L++) forks += count(a, L, MSM_OP_LINEAR, MSM_STREAM_AUX) > 0;
        cr_expect_eq(forks > 0, d < 2, "%s: layers with a shared expert", dirs[d]);
        cr_expect_eq(b->n_nodes, a->n_nodes + forks, "%s", dirs[d]);
        cr_expect_eq(b->n_vals, a->n_vals + 2 * forks, "%s", dirs[d]);
        for (int L = 0; L < b->n_layers; L++) {
            if (count(a, L, MSM_OP_LINEAR, MSM_STREAM_AUX) == 0) {
                cr_expect_eq(count(b, L, MSM_OP_ADD_RMSNORM, MSM_STREAM_AUX), 0, "%s layer %d", dirs[d], L);
                continue;
            }
            cr_assert_eq(count(b, L, MSM_OP_ADD_RMSNORM, MSM_STREAM_AUX), 1, "%s layer %d", dirs[d], L);
            int rec = -1, w = -1;
            for (int i = 0; i < b->n_nodes; i++) {
                const msm_node *x = &b->nodes[i];
                if (x->layer == L && x->op == MSM_OP_EVENT_RECORD && x->stream == MSM_STREAM_MAIN &&
                    x->role == MSM_ROLE_SHARED && rec < 0)
                    rec = i;
                if (x->layer == L && x->op == MSM_OP_EVENT_WAIT && x->stream == MSM_STREAM_AUX && w < 0) w = i;
            }
            cr_assert(rec > 0 && w > rec, "%s layer %d", dirs[d], L);
            const msm_node *mn = &b->nodes[rec + 1], *cp = &b->nodes[w + 1], *lin = &b->nodes[w + 2];
            cr_expect_eq(b->nodes[w].event, b->nodes[rec].event);
            cr_expect(mn->op == MSM_OP_ADD_RMSNORM && mn->stream == MSM_STREAM_MAIN, "%s layer %d: no norm after the RECORD",
                      dirs[d], L);
            cr_expect(b->nodes[rec - 1].op == MSM_OP_LINEAR, "%s layer %d: the RECORD follows the o_proj", dirs[d], L);
            cr_expect(b->nodes[rec + 2].role == MSM_ROLE_ROUTED, "%s layer %d: the router after the norm", dirs[d], L);
            cr_assert(cp->op == MSM_OP_ADD_RMSNORM && cp->stream == MSM_STREAM_AUX, "%s layer %d", dirs[d], L);
            cr_expect(cp->n_in == 2 && cp->in[0] == mn->in[0] && cp->in[1] == mn->in[1] && cp->w[0] == mn->w[0] &&
                      memcmp(&cp->attr, &mn->attr, sizeof cp->attr) == 0, "%s layer %d: not a copy", dirs[d], L);
            for (int j = 0; j < 2; j++) {
                const msm_value *x = &b->vals[cp->out[j]], *y = &b->vals[mn->out[j]];
                cr_expect(cp->out[j] != mn->out[j] && x->dtype == y->dtype && x->rows == y->rows && x->cols == y->cols,
                          "%s layer %d output %d", dirs[d], L, j);
                /* live from the fork to the join: no byte in common with what MAIN writes meanwhile */
                size_t xo = x->offset, xe = xo + msm_value_bytes_max(b, x);
                for (int i = rec + 1; i < b->n_nodes && b->nodes[i].layer <= L; i++) {
                    const msm_node *m = &b->nodes[i];
                    if (m->stream != MSM_STREAM_MAIN || m->op == MSM_OP_MOE_COMBINE_NORM) continue;
                    for (int o = 0; o < m->n_out; o++) {
                        const msm_value *mv = &b->vals[m->out[o]];
                        size_t mo = mv->offset, me = mo + msm_value_bytes_max(b, mv);
                        cr_expect(me <= xo || xe <= mo, "%s layer %d: %s shares bytes with %s", dirs[d], L, x->name,
                                  mv->name);
                    }
                }
            }
            cr_expect(lin->op == MSM_OP_LINEAR && lin->in[0] == cp->out[1], "%s layer %d: the gate/up reads %s",
                      dirs[d], L, b->vals[lin->in[0]].name);
        }
        msm_err err = {{0}};
        cr_assert_eq(msm_pass_fork_before_norm(b, &on, &again, &err), 0, "%s", err.msg);
        cr_expect(msm_graph_equal(b, again), "%s: fork_before_norm is not idempotent", dirs[d]);
        msm_pass_opts one = on;
        one.multi_stream = false;
        msm_graph *c = apply(g, &one);
        cr_expect_eq(count_op(c, MSM_OP_EVENT_RECORD), 0, "%s: one stream", dirs[d]);
        msm_graph *list[] = {g, a, b, again, c};
        for (int i = 0; i < 5; i++) msm_graph_free(list[i]);
    }
    msm_graph *g2 = plain("tests/data/qwen2moe-gqa", 2);
    msm_pass_opts on = all_on, off = all_on;
    on.prefetch_l2 = off.prefetch_l2 = false, on.fork_before_norm = true;
    msm_graph *a = apply(g2, &off), *b = apply(g2, &on);
    cr_expect(msm_graph_equal(a, b), "tp 2: the norm rides in the all-reduce; nothing to move");
    msm_graph_free(g2), msm_graph_free(a), msm_graph_free(b);
}
