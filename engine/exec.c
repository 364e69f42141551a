/* The executor: issues a verified graph's nodes, in list order, to a backend. The list order is
 * the issue order on each stream; events carry the cross-stream order. Nothing here knows about
 * devices: the same loop drives the CPU backend and the CUDA backend (and CUDA-graph capture). */
#include "msm_backend.h"

int msm_exec_issue(msm_backend *b, const msm_graph *g, const msm_step_dims *d, msm_err *err) {
    int r = 0;
    for (int i = 0; i < g->n_nodes && r == 0; i++) {
        const msm_node *n = &g->nodes[i];
        if (n->op == MSM_OP_EVENT_RECORD) r = b->vt->record(b, n->stream, n->event, err);
        else if (n->op == MSM_OP_EVENT_WAIT) r = b->vt->wait(b, n->stream, n->event, err);
        else r = b->vt->run(b, g, i, d, err);
    }
    return r;
}

int msm_exec_step(msm_backend *b, const msm_graph *g, const msm_step_dims *d, msm_err *err) {
    int r = b->vt->begin(b, err);
    if (r == 0) r = msm_exec_issue(b, g, d, err);
    /* always drain the streams, also after an error, so no worker still touches the arena */
    msm_err e2;
    int r2 = b->vt->sync(b, r ? &e2 : err);
    return r ? r : r2;
}
