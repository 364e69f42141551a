/* msm_fairq: the scheduler's waiting queue, round-robin over connections.
 *
 * Admission must not be first come, first served across clients: one connection that queues a
 * thousand requests would make every other client wait behind all of them. So each waiting
 * request gets a round: one more than the round of the previous request of its connection still
 * waiting, or than the round of the last request admitted, whichever is later. The queue is kept
 * in (round, arrival) order and admission takes its head. With one connection that is plain
 * first come, first served; with several, each connection's k-th waiting request is admitted in
 * the k-th round, so a connection that sends one request while another has 1,000 queued waits
 * for at most one request of each other connection. A request put back at the front (a
 * preempted sequence) goes before everything.
 *
 * The key is the connection id; nodes are embedded in the caller's items. Single-threaded (the
 * scheduler thread). */
#ifndef MSM_FAIRQ_H
#define MSM_FAIRQ_H

#include <stdint.h>

typedef struct msm_fairq_node {
    uint64_t key;
    uint64_t round;
    struct msm_fairq_node *next;
} msm_fairq_node;

#define MSM_FAIRQ_BUCKETS 256

typedef struct msm_fairq_key msm_fairq_key; /* a key with items waiting: its last round */

typedef struct msm_fairq {
    msm_fairq_node *head, *tail;
    int n;
    uint64_t round;           /* the round of the last item popped */
    msm_fairq_key *keys[MSM_FAIRQ_BUCKETS];
} msm_fairq;

void msm_fairq_init(msm_fairq *q);
/* Frees the key table (not the items). */
void msm_fairq_done(msm_fairq *q);

/* Queues n for key in its round. */
void msm_fairq_push(msm_fairq *q, msm_fairq_node *n, uint64_t key);
/* Queues n for key at the very front. */
void msm_fairq_push_front(msm_fairq *q, msm_fairq_node *n, uint64_t key);
/* Takes the head (NULL when empty); its round becomes the queue's. */
msm_fairq_node *msm_fairq_pop(msm_fairq *q);
/* Unlinks n, whose predecessor is prev (NULL: n is the head). For removal while walking. */
void msm_fairq_remove(msm_fairq *q, msm_fairq_node *prev, msm_fairq_node *n);

#endif
