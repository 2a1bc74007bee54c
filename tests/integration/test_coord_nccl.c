/*
 * test_coord_nccl.c — the coordinator's side of the NCCL data plane (coordinator/ncclboot.h)
 * against a real epmoe-coordinator process and fake workers (itest.h) that answer COMM_INIT.
 *
 * Proves: with data_plane nccl the cluster is not ready when every worker is READY but a
 * communicator is missing; COMM_INIT goes first to rank 0 alone, and the id rank 0 returns in
 * COMM_ID reaches every other rank unchanged; a forward meanwhile fails (refused, or timed out
 * while queued) naming the rank that has not finished; at the deadline that worker shows an error
 * saying it did not finish; the next round (generation 1) succeeds once it answers, and
 * forwards run; a STEP_FAILED with comm_aborted makes the coordinator build a new communicator
 * before the cluster is ready again; a ZeroMQ-plane coordinator refuses COMM_ messages.
 */
#include <stdio.h>
#include <string.h>

#include "itest.h"
#include "test.h"

static const char *coord_bin;

#define FINISH(t) CHECK_EQ(it_finish(&(t), test_cur_failed), 0)

static itest *start_nccl(int n, int silent_rank)
{
    it_opts o;
    it_default_opts(&o);
    o.n_workers = n;
    o.nccl = true;
    o.step_timeout_ms = 1000; /* also the communicator's timeout */
    itest *t = it_start(coord_bin, &o);
    if (t == NULL)
        return NULL;
    for (int r = 0; r < n; r++) {
        it_worker *w = it_worker_new(t, it_worker_name(t, r));
        w->comm_silent = r == silent_rank;
        if (it_worker_register(t, w) != 0)
            printf("  worker %d did not register: %s\n", r, w->last_error);
    }
    return t;
}

static void forward_ok(itest *t, it_client *c, int T, uint32_t seed)
{
    uint16_t hidden[64 * IT_H];
    it_make_input(T, seed, hidden, NULL);
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = rq.has_n_tokens = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = "layers.2";
    rq.n_tokens = (uint32_t)T;
    wire_payload p = {.data = hidden, .len = (size_t)T * IT_H * 2};
    it_send(t, c, &rq, &p, 1);
    CHECK(it_wait(t, c, 5000) != NULL);
    char why[512] = "";
    int rc = it_check_forward(t, c, T, hidden, NULL, why, sizeof why);
    if (rc != 0)
        printf("  forward: %s\n", why);
    CHECK_EQ(rc, 0);
}

static Epmoe__AdminReply *forward_any(itest *t, it_client *c)
{
    uint16_t hidden[4 * IT_H];
    it_make_input(4, 1, hidden, NULL);
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = rq.has_n_tokens = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = "layers.2";
    rq.n_tokens = 4;
    wire_payload p = {.data = hidden, .len = 4 * IT_H * 2};
    it_send(t, c, &rq, &p, 1);
    return it_wait(t, c, 5000);
}

TEST(the_cluster_waits_for_every_communicator_and_names_a_late_rank)
{
    itest *t = start_nccl(4, 3);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_wait_state(t, "loading", 3000), 0);
    it_pump(t, 300);
    CHECK(it_wait_state(t, "ready", 300) != 0); /* rank 2 never answers */
    it_worker *w0 = t->w[0], *w3 = t->w[3];
    CHECK_EQ(w0->n_comm_inits, 1);
    CHECK(!w0->got_id); /* rank 0 makes the id */
    for (int r = 1; r < 4; r++) {
        CHECK(t->w[r]->got_id);
        CHECK(memcmp(t->w[r]->comm_id, w0->comm_id, sizeof w0->comm_id) == 0);
    }
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = forward_any(t, c);
    /* refused, or (a formed cluster keeps requests queued) timed out while waiting: either way
     * the answer names the missing communicator rank */
    CHECK(r && !r->ok);
    if (r && r->error)
        CHECK_STR_HAS(r->error, ": waiting for COMM_DONE from rank 3 (b1)");
    /* the deadline: timeout_ms + 2 heartbeats after the round began */
    it_pump(t, 1500);
    r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_WORKERS, NULL);
    CHECK(r && r->n_workers == 4);
    if (r && r->n_workers == 4) {
        CHECK(r->workers[3]->error != NULL);
        char want[64];
        snprintf(want, sizeof want, "NCCL communicator of epoch %llu.",
                 (unsigned long long)it_epoch(t, 1));
        if (r->workers[3]->error)
            CHECK_STR_HAS(r->workers[3]->error, want);
        if (r->workers[3]->error)
            CHECK_STR_HAS(r->workers[3]->error, " not ready after ");
        if (r->workers[3]->error)
            CHECK_STR_HAS(r->workers[3]->error, "rank 3 (b1) did not finish");
        CHECK(r->workers[1]->error == NULL);
    }
    /* it answers the next round */
    w3->comm_silent = false;
    CHECK_EQ(it_wait_state(t, "ready", 5000), 0);
    CHECK(w0->comm_gen >= 1 && w3->comm_gen == w0->comm_gen);
    forward_ok(t, c, 17, 3);
    FINISH(t);
}

TEST(a_step_that_aborted_the_communicator_gets_a_new_one)
{
    itest *t = start_nccl(2, -1);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_wait_state(t, "ready", 3000), 0);
    it_client *c = it_client_new(t);
    forward_ok(t, c, 9, 1);
    CHECK_EQ(t->w[0]->comm_gen, 0);
    t->w[1]->behaviour = IT_FAIL; /* STEP_FAILED{comm_aborted} */
    Epmoe__AdminReply *r = forward_any(t, c);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_STEP_FAILED);
    t->w[1]->behaviour = IT_OK;
    CHECK_EQ(it_wait_state(t, "ready", 3000), 0);
    CHECK_EQ(t->w[0]->comm_gen, 1);
    CHECK_EQ(t->w[1]->comm_gen, 1);
    CHECK_EQ(t->w[0]->n_comm_inits, 2);
    forward_ok(t, c, 30, 2);
    FINISH(t);
}

TEST(a_zmq_plane_coordinator_refuses_comm_messages)
{
    it_opts o;
    it_default_opts(&o);
    o.n_workers = 1;
    itest *t = it_start(coord_bin, &o);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_register_all(t), 0);
    Epmoe__CommDone d = EPMOE__COMM_DONE__INIT;
    it_worker_send(t->w[0], EPMOE__MSG_TYPE__MSG_COMM_DONE, &d.base);
    it_pump(t, 300);
    CHECK_EQ(t->w[0]->last_error_code, EPMOE__ERROR_CODE__ERR_UNKNOWN_TYPE);
    CHECK_STR_HAS(t->w[0]->last_error, "MSG_COMM_DONE");
    FINISH(t);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/epmoe-coordinator\n", argv[0]);
        return 2;
    }
    coord_bin = argv[1];
    RUN(the_cluster_waits_for_every_communicator_and_names_a_late_rank);
    RUN(a_step_that_aborted_the_communicator_gets_a_new_one);
    RUN(a_zmq_plane_coordinator_refuses_comm_messages);
    return test_report();
}
