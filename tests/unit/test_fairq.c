/* Unit tests of the scheduler's waiting queue (daemon/fairq.c): round-robin over connections,
 * first come first served within one, preempted items at the front, removal while walking. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "msm_fairq.h"

typedef struct item {
    int id;
    msm_fairq_node node;
} item;

#define ITEM(n) ((item *)((char *)(n) - offsetof(item, node)))

static int pop_id(msm_fairq *q) {
    msm_fairq_node *n = msm_fairq_pop(q);
    return n ? ITEM(n)->id : -1;
}

Test(fairq, one_connection_is_first_come_first_served) {
    msm_fairq q;
    msm_fairq_init(&q);
    item it[5];
    for (int i = 0; i < 5; i++) {
        it[i].id = i;
        msm_fairq_push(&q, &it[i].node, 7);
    }
    for (int i = 0; i < 5; i++)
        cr_assert_eq(pop_id(&q), i);
    cr_assert_eq(pop_id(&q), -1);
    cr_assert_eq(q.n, 0);
    msm_fairq_done(&q);
}

Test(fairq, connections_take_turns_in_rounds) {
    msm_fairq q;
    msm_fairq_init(&q);
    static item a[100], b[3], c[1];
    for (int i = 0; i < 100; i++) {
        a[i].id = 1000 + i;
        msm_fairq_push(&q, &a[i].node, 1);
    }
    cr_assert_eq(pop_id(&q), 1000);
    for (int i = 0; i < 3; i++) {
        b[i].id = 2000 + i;
        msm_fairq_push(&q, &b[i].node, 2);
    }
    c[0].id = 3000;
    msm_fairq_push(&q, &c[0].node, 3);
    /* round 2: a's 2nd, b's 1st, c's 1st; round 3: a's 3rd, b's 2nd; ... */
    static const int want[] = {1001, 2000, 3000, 1002, 2001, 1003, 2002, 1004, 1005};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert_eq(pop_id(&q), want[i], "pop %zu", i);
    while (msm_fairq_pop(&q))
        ;
    msm_fairq_done(&q);
}

Test(fairq, an_item_put_back_goes_first_and_removal_keeps_the_order) {
    msm_fairq q;
    msm_fairq_init(&q);
    item it[6];
    for (int i = 0; i < 4; i++) {
        it[i].id = i;
        msm_fairq_push(&q, &it[i].node, (uint64_t)(i % 2));
    }
    cr_assert_eq(pop_id(&q), 0);
    it[4].id = 4;
    msm_fairq_push_front(&q, &it[4].node, 9); /* preempted: before everything */
    cr_assert_eq(pop_id(&q), 4);
    /* remove item 2 (connection 0's second) while walking */
    for (msm_fairq_node *prev = NULL, *n = q.head; n; prev = n, n = n->next)
        if (ITEM(n)->id == 2) {
            msm_fairq_remove(&q, prev, n);
            break;
        }
    cr_assert_eq(pop_id(&q), 1);
    cr_assert_eq(pop_id(&q), 3);
    cr_assert_eq(pop_id(&q), -1);
    cr_assert_null(q.tail);
    /* the key table is empty again: a connection starting now is not behind its old rounds */
    for (int b = 0; b < MSM_FAIRQ_BUCKETS; b++)
        cr_assert_null(q.keys[b]);
    msm_fairq_done(&q);
}
