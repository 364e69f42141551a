/* msm_fairq: round-robin admission over connections (see msm_fairq.h).
 *
 * A small hash table (chained, MSM_FAIRQ_BUCKETS buckets) maps each key with items waiting to the
 * round of its last one and how many it has; an entry goes when its count drops to 0, so the
 * table holds at most the connections that have requests waiting. Inserting walks from the head
 * to the first item of a later round, unless it belongs at the tail (the common case: one client,
 * or a steady mix); the queue is bounded by scheduler.max_queue. */
#include "msm_fairq.h"

#include <stdlib.h>
#include <string.h>

struct msm_fairq_key {
    uint64_t key;
    uint64_t round;           /* the round of its last waiting item */
    int waiting;
    struct msm_fairq_key *next;
};

void msm_fairq_init(msm_fairq *q) {
    memset(q, 0, sizeof *q);
}

void msm_fairq_done(msm_fairq *q) {
    for (int b = 0; b < MSM_FAIRQ_BUCKETS; b++)
        for (msm_fairq_key *k = q->keys[b], *n; k; k = n) {
            n = k->next;
            free(k);
        }
    memset(q->keys, 0, sizeof q->keys);
}

static msm_fairq_key **slot(msm_fairq *q, uint64_t key) {
    msm_fairq_key **pp = &q->keys[(key * 0x9e3779b97f4a7c15ull) >> 56];
    while (*pp && (*pp)->key != key)
        pp = &(*pp)->next;
    return pp;
}

/* The key's entry, made when missing (NULL when out of memory: the item is then queued without
 * a per-key round, at the current one, which is still fair to everyone else). */
static msm_fairq_key *key_get(msm_fairq *q, uint64_t key) {
    msm_fairq_key **pp = slot(q, key);
    if (!*pp && (*pp = calloc(1, sizeof **pp)))
        (*pp)->key = key;
    return *pp;
}

static void key_put(msm_fairq *q, uint64_t key) {
    msm_fairq_key **pp = slot(q, key), *k = *pp;
    if (k && --k->waiting <= 0) {
        *pp = k->next;
        free(k);
    }
}

void msm_fairq_push(msm_fairq *q, msm_fairq_node *n, uint64_t key) {
    msm_fairq_key *k = key_get(q, key);
    uint64_t last = k && k->round > q->round ? k->round : q->round;
    n->key = key;
    n->round = last + 1;
    if (k) {
        k->round = n->round;
        k->waiting++;
    }
    q->n++;
    if (!q->head || q->tail->round <= n->round) {
        n->next = NULL;
        if (q->tail)
            q->tail->next = n;
        else
            q->head = n;
        q->tail = n;
        return;
    }
    msm_fairq_node **pp = &q->head;
    while ((*pp)->round <= n->round)
        pp = &(*pp)->next;
    n->next = *pp;
    *pp = n;
}

void msm_fairq_push_front(msm_fairq *q, msm_fairq_node *n, uint64_t key) {
    msm_fairq_key *k = key_get(q, key);
    n->key = key;
    n->round = q->head && q->head->round < q->round ? q->head->round : q->round;
    if (k) {
        if (k->round < n->round)
            k->round = n->round;
        k->waiting++;
    }
    q->n++;
    n->next = q->head;
    q->head = n;
    if (!q->tail)
        q->tail = n;
}

void msm_fairq_remove(msm_fairq *q, msm_fairq_node *prev, msm_fairq_node *n) {
    if (prev)
        prev->next = n->next;
    else
        q->head = n->next;
    if (q->tail == n)
        q->tail = prev;
    n->next = NULL;
    q->n--;
    key_put(q, n->key);
}

msm_fairq_node *msm_fairq_pop(msm_fairq *q) {
    msm_fairq_node *n = q->head;
    if (!n)
        return NULL;
    msm_fairq_remove(q, NULL, n);
    if (n->round > q->round)
        q->round = n->round;
    return n;
}
