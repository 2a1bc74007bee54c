/*
 * test_coord_forward.c — forward steps through the real epmoe-coordinator with fake workers.
 *
 * Proves: a FORWARD is split into the contiguous per-rank chunks of docs/protocol.md and the
 * answers are reassembled in input order (T = 1, 3 < P, 64, 300; a hash layer carries the token
 * ids to the workers; an MTP layer works); three clients at once each get their own answer;
 * FORWARD before the cluster is ready gets ERR_NOT_READY naming the workers that are not;
 * malformed requests get ERR_BAD_REQUEST naming the problem (layer, size, ids, id range,
 * n_tokens, extra payloads); a worker's STEP_FAILED reaches the client as ERR_STEP_FAILED
 * naming the worker, the others get STEP_ABORT and the next forward works; a malformed
 * STEP_DONE fails the step the same way; a worker that stops heartbeating mid-step fails it with
 * ERR_WORKER_LOST naming the epoch change, the survivors serve in the next epoch, and the
 * worker's return restores the placement in another; a step that exceeds
 * step_timeout_ms gets ERR_TIMEOUT naming the silent worker; a full queue answers ERR_BUSY.
 *
 * Usage: test_coord_forward PATH/epmoe-coordinator
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "itest.h"
#include "test.h"

static const char *coord_bin;

#define FINISH(t) CHECK_EQ(it_finish(&(t), test_cur_failed), 0)

static itest *start_ready(int step_timeout_ms)
{
    it_opts o;
    it_default_opts(&o);
    o.nccl = true; /* the coordinator's FORWARD is the NCCL plane's (docs/protocol.md) */
    if (step_timeout_ms)
        o.step_timeout_ms = step_timeout_ms;
    itest *t = it_start(coord_bin, &o);
    if (t && it_register_all(t) != 0) {
        it_finish(&t, true);
        return NULL;
    }
    return t;
}

TEST(forward_reassembles_in_input_order)
{
    itest *t = start_ready(0);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_client *c = it_client_new(t);
    const int Ts[] = {1, 3, 64, 300};
    uint64_t last_step = 0;
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        it_fwd in = it_fwd_make(Ts[i], (uint32_t)i + 1, false);
        it_fwd_send(t, c, "layers.2", &in);
        CHECK(it_wait(t, c, 5000) != NULL);
        CHECK_EQ(it_fwd_check(t, c, &in), 0);
        if (c->reply && c->reply->forward) {
            CHECK(c->reply->forward->step_id > last_step);
            last_step = c->reply->forward->step_id;
            CHECK_EQ(c->reply->forward->layer, 2);
            CHECK(c->reply->forward->seconds >= 0 && c->reply->forward->seconds < 5);
        }
        it_fwd_free(&in);
    }
    /* a hash layer: the ids reach the workers (they echo them in topk_ids[.][1]) */
    it_fwd in = it_fwd_make(37, 9, true);
    it_fwd_send(t, c, "0", &in);
    CHECK(it_wait(t, c, 5000) != NULL);
    CHECK_EQ(it_fwd_check(t, c, &in), 0);
    it_fwd_free(&in);
    /* the MTP layer (score-routed) by name */
    in = it_fwd_make(5, 11, false);
    it_fwd_send(t, c, "mtp.0", &in);
    CHECK(it_wait(t, c, 5000) != NULL);
    CHECK_EQ(it_fwd_check(t, c, &in), 0);
    if (c->reply && c->reply->forward)
        CHECK_EQ(c->reply->forward->layer, IT_L);
    it_fwd_free(&in);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->steps_done == 6 && r->steps_failed == 0);
    FINISH(t);
}

TEST(concurrent_clients_get_their_own_answers)
{
    itest *t = start_ready(0);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_client *c[3];
    it_fwd in[3];
    for (int i = 0; i < 3; i++) {
        c[i] = it_client_new(t);
        in[i] = it_fwd_make(50 + 17 * i, 100 + (uint32_t)i, false);
    }
    for (int i = 0; i < 3; i++)
        it_fwd_send(t, c[i], "layers.1", &in[i]);
    for (int i = 0; i < 3; i++) {
        CHECK(it_wait(t, c[i], 5000) != NULL);
        CHECK_EQ(it_fwd_check(t, c[i], &in[i]), 0);
        it_fwd_free(&in[i]);
    }
    FINISH(t);
}

TEST(forward_not_ready_names_workers)
{
    it_opts o;
    it_default_opts(&o);
    o.nccl = true; /* the coordinator's FORWARD is the NCCL plane's (docs/protocol.md) */
    itest *t = it_start(coord_bin, &o);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_worker_register(t, it_worker_new(t, "a0")), 0);
    it_client *c = it_client_new(t);
    it_fwd in = it_fwd_make(4, 1, false);
    it_fwd_send(t, c, "layers.1", &in);
    Epmoe__AdminReply *r = it_wait(t, c, 3000);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_NOT_READY);
    if (r && r->error) {
        CHECK_STR_HAS(r->error, "forming");
        CHECK_STR_HAS(r->error, "a1 (absent)");
        CHECK_STR_HAS(r->error, "b1 (absent)");
        CHECK(strstr(r->error, "a0") == NULL);
    }
    it_fwd_free(&in);
    FINISH(t);
}

/* Send a FORWARD built by hand; the reply. */
static Epmoe__AdminReply *forward_raw(itest *t, it_client *c, const char *layer, int has_n,
                                      uint32_t n, int has_ids, const wire_payload *p, int np)
{
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = (char *)layer;
    rq.has_n_tokens = has_n;
    rq.n_tokens = n;
    rq.has_has_ids = has_ids >= 0;
    rq.has_ids = has_ids > 0;
    it_send(t, c, &rq, p, np);
    return it_wait(t, c, 3000);
}

static void check_bad(Epmoe__AdminReply *r, const char *needle)
{
    CHECK(r != NULL);
    if (r == NULL)
        return;
    CHECK(!r->ok);
    CHECK_EQ(r->error_code, EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    CHECK_STR_HAS(r->error ? r->error : "", needle);
}

TEST(forward_validation_errors_name_the_problem)
{
    itest *t = start_ready(0);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_client *c = it_client_new(t);
    static uint16_t hidden[8 * IT_H];
    static int64_t ids[8];
    it_make_input(8, 3, hidden, ids);
    wire_payload h8 = {.data = hidden, .len = sizeof hidden};
    wire_payload i8 = {.data = ids, .len = sizeof ids};
    wire_payload both[2] = {h8, i8};
    check_bad(forward_raw(t, c, "layers.7", 1, 8, -1, &h8, 1), "layers.7");
    check_bad(forward_raw(t, c, "layers.7", 1, 8, -1, &h8, 1), "layers.0..layers.3");
    check_bad(forward_raw(t, c, "mtp.3", 1, 8, -1, &h8, 1), "mtp.3");
    check_bad(forward_raw(t, c, "bogus", 1, 8, -1, &h8, 1), "bogus");
    check_bad(forward_raw(t, c, NULL, 1, 8, -1, &h8, 1), "without a layer");
    check_bad(forward_raw(t, c, "layers.1", 1, 0, -1, &h8, 1), "n_tokens 0 is out of range");
    check_bad(forward_raw(t, c, "layers.1", 0, 0, -1, &h8, 1), "n_tokens (absent)");
    check_bad(forward_raw(t, c, "layers.1", 1, EP_MAX_TOKENS + 1, -1, &h8, 1), "out of range");
    wire_payload short_h = {.data = hidden, .len = sizeof hidden - 2};
    check_bad(forward_raw(t, c, "layers.1", 1, 8, -1, &short_h, 1),
              "hidden payload has 2046 bytes");
    check_bad(forward_raw(t, c, "layers.1", 1, 9, -1, &h8, 1), "expected 2304");
    check_bad(forward_raw(t, c, "layers.1", 1, 8, -1, NULL, 0), "without the hidden payload");
    /* hash layer 0 needs ids; score layers must not get them */
    check_bad(forward_raw(t, c, "layers.0", 1, 8, -1, &h8, 1), "hash-routed");
    check_bad(forward_raw(t, c, "layers.0", 1, 8, 0, both, 2), "hash-routed");
    check_bad(forward_raw(t, c, "layers.1", 1, 8, 1, both, 2), "score-routed");
    check_bad(forward_raw(t, c, "layers.1", 1, 8, -1, both, 2), "unexpected payloads");
    wire_payload i7 = {.data = ids, .len = 7 * 8};
    wire_payload short_ids[2] = {h8, i7};
    check_bad(forward_raw(t, c, "layers.0", 1, 8, 1, short_ids, 2), "ids payload has 56 bytes");
    ids[5] = IT_VOCAB; /* one past the last id */
    check_bad(forward_raw(t, c, "layers.0", 1, 8, 1, both, 2), "token 5: id 1000 is out of range");
    ids[5] = -3;
    check_bad(forward_raw(t, c, "layers.0", 1, 8, 1, both, 2), "token 5: id -3");
    /* nothing above reached the workers, and the daemon still serves */
    for (int k = 0; k < t->n_w; k++)
        CHECK_EQ(t->w[k]->n_steps, 0);
    ids[5] = 999;
    it_fwd in = {.T = 8, .hidden = hidden, .ids = ids};
    it_fwd_send(t, c, "layers.0", &in);
    CHECK(it_wait(t, c, 5000) != NULL);
    CHECK_EQ(it_fwd_check(t, c, &in), 0);
    FINISH(t);
}

TEST(step_failed_names_worker_aborts_others_next_works)
{
    itest *t = start_ready(0);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_client *c = it_client_new(t);
    t->w[1]->behaviour = IT_FAIL;
    t->w[2]->behaviour = IT_HOLD; /* answers only once it hears STEP_ABORT */
    it_fwd in = it_fwd_make(16, 5, false);
    it_fwd_send(t, c, "layers.3", &in);
    Epmoe__AdminReply *r = it_wait(t, c, 5000);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_STEP_FAILED);
    if (r && r->error)
        CHECK_STR_HAS(r->error, "worker a1 (rank 1): injected failure on a1");
    it_pump(t, 200);
    CHECK_EQ(t->w[0]->n_aborts, 1);
    CHECK_EQ(t->w[2]->n_aborts, 1);
    CHECK_EQ(t->w[3]->n_aborts, 1);
    CHECK_EQ(t->w[1]->n_aborts, 0); /* it failed the step itself */
    CHECK_EQ(t->w[2]->held_step, 0);
    for (int k = 0; k < t->n_w; k++)
        t->w[k]->behaviour = IT_OK;
    it_fwd_send(t, c, "layers.3", &in);
    CHECK(it_wait(t, c, 5000) != NULL);
    CHECK_EQ(it_fwd_check(t, c, &in), 0);
    r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->steps_done == 1 && r->steps_failed == 1);
    if (r && r->n_workers == 4)
        CHECK(r->workers[1]->error && strstr(r->workers[1]->error, "injected failure") != NULL);
    /* a malformed STEP_DONE fails the step too, naming the worker and the payload */
    t->w[3]->behaviour = IT_BAD_DONE;
    it_fwd_send(t, c, "layers.3", &in);
    r = it_wait(t, c, 5000);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_STEP_FAILED);
    if (r && r->error) {
        CHECK_STR_HAS(r->error, "worker b1 (rank 3): malformed STEP_DONE");
        CHECK_STR_HAS(r->error, "out bf16");
    }
    it_pump(t, 100);
    CHECK_EQ(t->w[3]->last_error_code, EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    t->w[3]->behaviour = IT_OK;
    it_fwd_send(t, c, "layers.3", &in);
    CHECK(it_wait(t, c, 5000) != NULL);
    CHECK_EQ(it_fwd_check(t, c, &in), 0);
    it_fwd_free(&in);
    FINISH(t);
}

TEST(worker_lost_mid_step_then_back)
{
    itest *t = start_ready(0);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_client *c = it_client_new(t);
    it_worker *w = t->w[2];
    w->behaviour = IT_MUTE; /* takes the step and goes silent */
    it_fwd in = it_fwd_make(20, 7, false);
    it_fwd_send(t, c, "layers.1", &in);
    Epmoe__AdminReply *r = it_wait(t, c, 5000);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_WORKER_LOST);
    if (r && r->error) {
        CHECK_STR_HAS(r->error, "worker b0 (rank 2) was lost");
        CHECK_STR_HAS(r->error, "silent for");
    }
    if (r && r->error) {
        char want[128];
        snprintf(want, sizeof want, "placement epoch %llu -> %llu moves its experts to the other",
                 (unsigned long long)it_epoch(t, 1), (unsigned long long)it_epoch(t, 2));
        CHECK_STR_HAS(r->error, want);
    }
    /* the three survivors serve in epoch 2: b0's chunk goes to them */
    CHECK_EQ(it_wait_epoch(t, it_epoch(t, 2), "ready", 3000), 0);
    it_fwd_send(t, c, "layers.1", &in);
    CHECK(it_wait(t, c, 5000) != NULL);
    CHECK_EQ(it_fwd_check(t, c, &in), 0);
    CHECK_EQ(t->w[0]->members, 0xBu);
    /* the worker restarts and registers again: epoch 3 gives it its experts back */
    w->behaviour = IT_OK;
    it_worker_reconnect(t, w);
    CHECK_EQ(it_worker_register(t, w), 0);
    CHECK_EQ(it_wait_epoch(t, it_epoch(t, 3), "ready", 3000), 0);
    it_fwd_send(t, c, "layers.1", &in);
    CHECK(it_wait(t, c, 5000) != NULL);
    CHECK_EQ(it_fwd_check(t, c, &in), 0);
    CHECK_EQ(t->w[0]->members, 0xFu);
    it_fwd_free(&in);
    FINISH(t);
}

TEST(restart_mid_step_fails_it_and_recovers)
{
    itest *t = start_ready(0);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_client *c = it_client_new(t);
    it_worker *w = t->w[1];
    w->behaviour = IT_HOLD;
    it_fwd in = it_fwd_make(12, 3, false);
    it_fwd_send(t, c, "layers.1", &in);
    it_pump(t, 100);
    CHECK(w->held_step != 0);
    uint64_t held = w->held_step;
    /* a1 restarts (a new connection) while it holds the step */
    w->behaviour = IT_OK;
    it_worker_reconnect(t, w);
    Epmoe__Register reg = EPMOE__REGISTER__INIT;
    reg.name = "a1";
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_REGISTER, &reg.base);
    Epmoe__AdminReply *r = it_wait(t, c, 3000);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_WORKER_LOST);
    if (r && r->error) {
        char want[128];
        /* the old connection closed first: lost when the coordinator notices that (a send
         * fails) or when the new one registers, whichever comes first */
        snprintf(want, sizeof want,
                 "worker a1 (rank 1) was lost during step %llu: ", (unsigned long long)held);
        CHECK_STR_HAS(r->error, want);
    }
    CHECK_EQ(it_worker_register(t, w), 0);
    CHECK_EQ(it_wait_state(t, "ready", 3000), 0);
    it_fwd_send(t, c, "layers.1", &in);
    CHECK(it_wait(t, c, 5000) != NULL);
    CHECK_EQ(it_fwd_check(t, c, &in), 0);
    it_fwd_free(&in);
    FINISH(t);
}

TEST(step_timeout_names_silent_worker)
{
    itest *t = start_ready(300);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_client *c = it_client_new(t);
    t->w[1]->behaviour = IT_HOLD;
    it_fwd in = it_fwd_make(10, 2, false);
    int64_t t0 = it_now_ms();
    it_fwd_send(t, c, "layers.2", &in);
    Epmoe__AdminReply *r = it_wait(t, c, 5000);
    int64_t took = it_now_ms() - t0;
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_TIMEOUT);
    if (r && r->error) {
        CHECK_STR_HAS(r->error, "exceeded step_timeout_ms 300");
        CHECK_STR_HAS(r->error, "a1 (rank 1)");
    }
    CHECK(took >= 290 && took < 2000);
    /* the held worker answered the abort: the next step runs */
    t->w[1]->behaviour = IT_OK;
    it_fwd_send(t, c, "layers.2", &in);
    CHECK(it_wait(t, c, 5000) != NULL);
    CHECK_EQ(it_fwd_check(t, c, &in), 0);
    it_fwd_free(&in);
    FINISH(t);
}

TEST(full_queue_is_busy_and_shutdown_answers_all)
{
    itest *t = start_ready(0);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    t->w[0]->behaviour = IT_HOLD;
    /* a raw DEALER, not pumped by the harness: this test reads every reply itself */
    void *sock = zmq_socket(t->zctx, ZMQ_DEALER);
    wire_socket_defaults(sock, (int64_t)EP_MAX_DATA_MSG, NULL);
    zmq_connect(sock, t->admin);
    it_fwd in = it_fwd_make(2, 1, false);
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = "layers.1";
    rq.has_n_tokens = 1;
    rq.n_tokens = 2;
    wire_payload p = {.data = in.hidden, .len = (size_t)2 * IT_H * 2};
    /* one in flight + EP_MAX_QUEUED_STEPS queued + one too many */
    const int n = EP_MAX_QUEUED_STEPS + 2;
    for (int i = 0; i < n; i++) {
        rq.has_id = 1;
        rq.id = 500 + (uint64_t)i;
        wire_send(sock, NULL, 0, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, &rq.base, &p, 1, false, NULL);
    }
    int busy = 0, down = 0, other = 0;
    uint64_t busy_id = 0;
    int64_t end = it_now_ms() + 5000;
    bool killed = false;
    while (busy + down + other < n && it_now_ms() < end) {
        it_pump(t, 10); /* the fake workers */
        wire_msg m;
        while (wire_recv(sock, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, NULL) ==
               WIRE_OK) {
            Epmoe__AdminReply *r =
                (Epmoe__AdminReply *)wire_unpack(&epmoe__admin_reply__descriptor, &m, NULL);
            if (r && r->error_code == EPMOE__ERROR_CODE__ERR_BUSY) {
                busy++;
                busy_id = r->id;
            } else if (r && r->error_code == EPMOE__ERROR_CODE__ERR_SHUTTING_DOWN) {
                down++;
            } else {
                other++;
            }
            if (r)
                wire_free_unpacked(&r->base);
            wire_msg_close(&m);
        }
        if (busy == 1 && !killed) {
            kill(t->pid, SIGTERM);
            killed = true;
        }
    }
    CHECK_EQ(busy, 1);
    CHECK_EQ(busy_id, 500 + n - 1);
    CHECK_EQ(down, n - 1);
    CHECK_EQ(other, 0);
    CHECK_EQ(it_wait_exit(t, 5000), 0);
    zmq_close(sock);
    it_fwd_free(&in);
    FINISH(t);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/epmoe-coordinator\n", argv[0]);
        return 2;
    }
    coord_bin = argv[1];
    RUN(forward_reassembles_in_input_order);
    RUN(concurrent_clients_get_their_own_answers);
    RUN(forward_not_ready_names_workers);
    RUN(forward_validation_errors_name_the_problem);
    RUN(step_failed_names_worker_aborts_others_next_works);
    RUN(worker_lost_mid_step_then_back);
    RUN(restart_mid_step_fails_it_and_recovers);
    RUN(step_timeout_names_silent_worker);
    RUN(full_queue_is_busy_and_shutdown_answers_all);
    return test_report();
}
