/*
 * test_ncclboot.c — the coordinator's NCCL communicator rounds (coordinator/ncclboot.h), driven
 * message by message through its ob_box.
 *
 * Proves: a round starts only when every worker is ready, asks rank 0 alone for the id, relays
 * exactly that id to every other rank (and nothing for P = 1), is ready only after every
 * rank's COMM_DONE{ok}; COMM_IDs from another rank, of another round or of the wrong size are
 * refused or dropped; a failed COMM_DONE and a passed deadline each name the ranks at fault
 * (OB_EV_ERROR) and retry after a doubling backoff with the next generation; invalidation (a
 * step failed with the communicator aborted, a worker no longer ready) forces a new round; a
 * new epoch starts at generation 0; nb_shrink_plan accepts exactly the ordered subsets.
 */
#include "coordinator/ncclboot.h"

#include "test.h"

#define SPEC_TEXT                                                                                  \
    "cluster: {name: c}\n"                                                                         \
    "coordinator: {listen: \"tcp://127.0.0.1:7400\", admin: \"tcp://127.0.0.1:7401\", "            \
    "heartbeat_ms: 100, step_timeout_ms: 1000}\n"                                                  \
    "model: {path: /m}\n"                                                                          \
    "expert_parallel: {data_plane: nccl}\n"                                                        \
    "nodes:\n"                                                                                     \
    "  - name: n0\n"                                                                               \
    "    workers:\n"                                                                               \
    "      - {name: w0, device: \"cuda:0\", data: \"tcp://h:1\"}\n"                                \
    "      - {name: w1, device: \"cuda:1\", data: \"tcp://h:2\"}\n"                                \
    "      - {name: w2, device: \"cuda:2\", data: \"tcp://h:3\"}\n"

static spec_cluster *spec;
static uint8_t body[256];

static nb_env env_at(int64_t now, bool ready)
{
    return (nb_env){.spec = spec, .epoch = 1, .now_ms = now, .all_ready = ready};
}

static wire_msg msg_of(uint16_t type, const ProtobufCMessage *m)
{
    wire_msg w = {.type = type, .body = body};
    w.body_len = protobuf_c_message_pack(m, body);
    return w;
}

static wire_msg comm_id(uint64_t epoch, uint32_t gen, size_t id_len, uint8_t fill)
{
    static uint8_t id[200];
    memset(id, fill, sizeof id);
    Epmoe__CommId m = EPMOE__COMM_ID__INIT;
    m.has_epoch = m.has_generation = m.has_nccl_id = 1;
    m.epoch = epoch;
    m.generation = gen;
    m.nccl_id.len = id_len;
    m.nccl_id.data = id;
    return msg_of(EPMOE__MSG_TYPE__MSG_COMM_ID, &m.base);
}

static wire_msg comm_done(uint32_t gen, bool ok, const char *why)
{
    Epmoe__CommDone m = EPMOE__COMM_DONE__INIT;
    m.has_epoch = m.has_generation = m.has_ok = 1;
    m.epoch = 1;
    m.generation = gen;
    m.ok = ok;
    m.message = (char *)why;
    return msg_of(EPMOE__MSG_TYPE__MSG_COMM_DONE, &m.base);
}

/* The COMM_INIT queued as message i of out (NULL when it is something else). */
static Epmoe__CommInit *init_at(const ob_box *out, int i)
{
    if (i >= out->n_msg || out->msg[i].type != EPMOE__MSG_TYPE__MSG_COMM_INIT)
        return NULL;
    return epmoe__comm_init__unpack(NULL, out->msg[i].body_len, out->msg[i].body);
}

TEST(a_round_asks_rank_0_relays_its_id_and_waits_for_every_rank)
{
    nb_boot *b = nb_create(3, NULL);
    ob_box out = {0};
    nb_env e = env_at(1000, false);
    nb_pump(b, &e, &out);
    CHECK_EQ(out.n_msg, 0); /* not every worker is ready */
    e.all_ready = true;
    nb_pump(b, &e, &out);
    CHECK_EQ(out.n_msg, 1);
    Epmoe__CommInit *ci = init_at(&out, 0);
    CHECK(ci != NULL);
    if (ci) {
        CHECK_EQ(out.msg[0].rank, 0);
        CHECK_EQ(ci->epoch, 1);
        CHECK_EQ(ci->generation, 0);
        CHECK_EQ(ci->timeout_ms, 1000);
        CHECK(!ci->has_nccl_id); /* rank 0 makes it */
        epmoe__comm_init__free_unpacked(ci, NULL);
    }
    char text[600];
    nb_not_ready_text(b, spec, text, sizeof text);
    CHECK_STR_HAS(text, "epoch 1.0: waiting for COMM_ID from rank 0 (w0)");
    ob_clear(&out);

    wire_msg m = comm_id(1, 0, 128, 0xAB);
    nb_on_message(b, &e, 1, &m, &out); /* only rank 0 sends the id */
    CHECK_EQ(out.n_msg, 1);
    CHECK_EQ(out.msg[0].type, EPMOE__MSG_TYPE__MSG_ERROR);
    ob_clear(&out);
    m = comm_id(1, 0, 64, 0xAB);
    nb_on_message(b, &e, 0, &m, &out); /* wrong size */
    CHECK_EQ(out.n_msg, 1);
    CHECK_EQ(out.msg[0].type, EPMOE__MSG_TYPE__MSG_ERROR);
    ob_clear(&out);
    m = comm_id(1, 7, 128, 0xAB);
    nb_on_message(b, &e, 0, &m, &out); /* another round: dropped */
    CHECK_EQ(out.n_msg, 0);
    m = comm_id(1, 0, 128, 0xAB);
    nb_on_message(b, &e, 0, &m, &out);
    CHECK_EQ(out.n_msg, 2);
    for (int i = 0; i < out.n_msg; i++) {
        ci = init_at(&out, i);
        CHECK(ci != NULL);
        if (ci == NULL)
            continue;
        CHECK_EQ(out.msg[i].rank, i + 1);
        CHECK(ci->has_nccl_id && ci->nccl_id.len == 128);
        CHECK(ci->nccl_id.len == 128 && ci->nccl_id.data[0] == 0xAB &&
              ci->nccl_id.data[127] == 0xAB);
        CHECK_EQ(ci->generation, 0);
        epmoe__comm_init__free_unpacked(ci, NULL);
    }
    ob_clear(&out);

    m = comm_done(0, true, NULL);
    nb_on_message(b, &e, 0, &m, &out);
    nb_on_message(b, &e, 1, &m, &out);
    nb_on_message(b, &e, 1, &m, &out); /* a repeat counts once */
    CHECK(!nb_ready(b));
    nb_not_ready_text(b, spec, text, sizeof text);
    CHECK_STR_HAS(text, "waiting for COMM_DONE from rank 2 (w2)");
    nb_on_message(b, &e, 2, &m, &out);
    CHECK(nb_ready(b));
    CHECK_EQ(nb_next_deadline(b), INT64_MAX);
    nb_pump(b, &e, &out);
    CHECK_EQ(out.n_msg, 0); /* ready: nothing more to do */

    nb_invalidate(b, "step 4 failed on rank 1 (w1)");
    CHECK(!nb_ready(b));
    nb_pump(b, &e, &out);
    ci = init_at(&out, 0);
    CHECK(ci != NULL && ci->generation == 1);
    if (ci)
        epmoe__comm_init__free_unpacked(ci, NULL);
    ob_free(&out);
    nb_destroy(&b);
}

TEST(a_late_rank_is_named_and_the_round_retried_after_a_backoff)
{
    nb_boot *b = nb_create(3, NULL);
    ob_box out = {0};
    nb_env e = env_at(1000, true);
    nb_pump(b, &e, &out);
    wire_msg m = comm_id(1, 0, 128, 1);
    nb_on_message(b, &e, 0, &m, &out);
    m = comm_done(0, true, NULL);
    nb_on_message(b, &e, 0, &m, &out);
    ob_clear(&out);
    /* deadline: step_timeout_ms + 2 heartbeats = 1200 ms after the start */
    CHECK_EQ(nb_next_deadline(b), 2200);
    e.now_ms = 2199;
    nb_tick(b, &e, &out);
    CHECK_EQ(out.n_ev, 0);
    e.now_ms = 2200;
    nb_tick(b, &e, &out);
    CHECK_EQ(out.n_ev, 2);
    ob_event ev;
    int named[3] = {0};
    while (ob_take_event(&out, &ev)) {
        CHECK_EQ(ev.kind, OB_EV_ERROR);
        named[ev.rank]++;
        CHECK_STR_HAS(ev.text, "NCCL communicator of epoch 1.0 not ready after 1200 ms: rank 1 "
                               "(w1), rank 2 (w2) did not finish");
    }
    CHECK(!named[0] && named[1] && named[2]);
    /* retry after heartbeat_ms (100), not before */
    CHECK_EQ(nb_next_deadline(b), 2300);
    e.now_ms = 2299;
    nb_pump(b, &e, &out);
    CHECK_EQ(out.n_msg, 0);
    e.now_ms = 2300;
    nb_pump(b, &e, &out);
    Epmoe__CommInit *ci = init_at(&out, 0);
    CHECK(ci != NULL && ci->generation == 1);
    if (ci)
        epmoe__comm_init__free_unpacked(ci, NULL);
    ob_clear(&out);
    /* a worker's own failure: named with its reason; the backoff doubles */
    m = comm_done(1, false, "not ready: init not done after 1000 ms; aborted");
    nb_on_message(b, &e, 2, &m, &out);
    CHECK(ob_take_event(&out, &ev));
    CHECK_EQ(ev.rank, 2);
    CHECK_STR_HAS(ev.text, "NCCL communicator of epoch 1.1: rank 2 (w2): not ready: init not done "
                           "after 1000 ms; aborted");
    CHECK_EQ(nb_next_deadline(b), 2300 + 200);
    char text[600];
    nb_not_ready_text(b, spec, text, sizeof text);
    CHECK_STR_HAS(text, "rank 2 (w2): not ready");
    ob_clear(&out);
    /* rank 0 silent: only rank 0 is named */
    e.now_ms = 2500;
    nb_pump(b, &e, &out);
    ob_clear(&out);
    e.now_ms = 2500 + 1200;
    nb_tick(b, &e, &out);
    CHECK(ob_take_event(&out, &ev));
    CHECK_EQ(ev.rank, 0);
    CHECK_STR_HAS(ev.text, "epoch 1.2 not ready after 1200 ms: rank 0 (w0) sent no COMM_ID");
    CHECK(!ob_take_event(&out, &ev));
    ob_free(&out);
    nb_destroy(&b);
}

TEST(one_rank_needs_no_relay_and_a_new_epoch_starts_at_generation_0)
{
    nb_boot *b = nb_create(1, NULL);
    ob_box out = {0};
    nb_env e = env_at(0, true);
    nb_pump(b, &e, &out);
    ob_clear(&out);
    wire_msg m = comm_id(1, 0, 128, 2);
    nb_on_message(b, &e, 0, &m, &out);
    CHECK_EQ(out.n_msg, 0);
    m = comm_done(0, true, NULL);
    nb_on_message(b, &e, 0, &m, &out);
    CHECK(nb_ready(b));
    /* a worker drops out: the communicator is void; the next epoch starts over */
    e.all_ready = false;
    nb_pump(b, &e, &out);
    CHECK(!nb_ready(b));
    e = (nb_env){.spec = spec, .epoch = 2, .now_ms = 10, .all_ready = true};
    nb_pump(b, &e, &out);
    Epmoe__CommInit *ci = init_at(&out, 0);
    CHECK(ci != NULL && ci->epoch == 2 && ci->generation == 0);
    if (ci)
        epmoe__comm_init__free_unpacked(ci, NULL);
    ob_free(&out);
    nb_destroy(&b);
}

/* Answer a round from every member: COMM_ID from the first (if asked), COMM_DONE from all. */
static void answer_round(nb_boot *b, nb_env *e, ob_box *out, uint32_t gen, const int *ranks, int n)
{
    wire_msg m = comm_id(e->epoch, gen, 128, 5);
    nb_on_message(b, e, ranks[0], &m, out);
    Epmoe__CommDone d = EPMOE__COMM_DONE__INIT;
    d.has_epoch = d.has_generation = d.has_ok = 1;
    d.epoch = e->epoch;
    d.generation = gen;
    d.ok = 1;
    m = msg_of(EPMOE__MSG_TYPE__MSG_COMM_DONE, &d.base);
    for (int i = 0; i < n; i++)
        nb_on_message(b, e, ranks[i], &m, out);
}

TEST(the_communicator_spans_the_members_and_shrinks_over_survivors)
{
    nb_boot *b = nb_create(3, NULL);
    ob_box out = {0};
    uint8_t all[3] = {1, 1, 1}, survivors[3] = {1, 0, 1}, lone[3] = {0, 0, 1};
    nb_env e = {.spec = spec, .epoch = 1, .member = all, .now_ms = 0, .all_ready = true};
    nb_pump(b, &e, &out);
    answer_round(b, &e, &out, 0, (const int[]){0, 1, 2}, 3);
    CHECK(nb_ready(b));
    ob_clear(&out);
    /* w1 is lost between steps: epoch 2 of the survivors shrinks the ready communicator */
    e = (nb_env){.spec = spec, .epoch = 2, .member = survivors, .now_ms = 10, .all_ready = true};
    nb_pump(b, &e, &out);
    CHECK_EQ(out.n_msg, 2);
    for (int i = 0; i < out.n_msg; i++) {
        Epmoe__CommInit *ci = init_at(&out, i);
        CHECK(ci != NULL);
        if (ci == NULL)
            continue;
        CHECK_EQ(out.msg[i].rank, i == 0 ? 0 : 2);
        CHECK(ci->has_shrink && ci->shrink && !ci->has_nccl_id);
        CHECK(ci->parent_epoch == 1 && ci->parent_generation == 0 && ci->epoch == 2);
        CHECK(ci->n_exclude_ranks == 1 && ci->exclude_ranks[0] == 1);
        CHECK(ci->rank == (uint32_t)i && ci->size == 2 && ci->n_members == 2);
        CHECK(ci->n_members == 2 && ci->members[0] == 0 && ci->members[1] == 2);
        epmoe__comm_init__free_unpacked(ci, NULL);
    }
    ob_clear(&out);
    wire_msg m;
    Epmoe__CommDone d = EPMOE__COMM_DONE__INIT;
    d.has_epoch = d.has_generation = d.has_ok = 1;
    d.epoch = 2;
    d.ok = 1;
    m = msg_of(EPMOE__MSG_TYPE__MSG_COMM_DONE, &d.base);
    nb_on_message(b, &e, 1, &m, &out); /* not a member: dropped */
    nb_on_message(b, &e, 0, &m, &out);
    CHECK(!nb_ready(b));
    nb_on_message(b, &e, 2, &m, &out);
    CHECK(nb_ready(b));
    /* a failed step invalidates it: the next epoch builds a new one, from its first member */
    nb_invalidate(b, "step 9 failed");
    e = (nb_env){.spec = spec, .epoch = 3, .member = lone, .now_ms = 20, .all_ready = true};
    nb_pump(b, &e, &out);
    Epmoe__CommInit *ci = init_at(&out, 0);
    CHECK(ci != NULL && !ci->shrink && !ci->has_nccl_id && ci->size == 1 && ci->rank == 0);
    CHECK(out.n_msg == 1 && out.msg[0].rank == 2);
    if (ci)
        epmoe__comm_init__free_unpacked(ci, NULL);
    ob_free(&out);
    nb_destroy(&b);
}

TEST(shrink_plans_only_ordered_subsets)
{
    uint32_t ex[8];
    int n;
    const int keep_023[] = {0, 2, 3};
    CHECK_EQ(nb_shrink_plan(4, keep_023, 3, ex, &n), 1);
    CHECK_EQ(n, 1);
    CHECK_EQ(ex[0], 1);
    const int keep_13[] = {1, 3};
    CHECK_EQ(nb_shrink_plan(5, keep_13, 2, ex, &n), 1);
    CHECK_EQ(n, 3);
    CHECK(ex[0] == 0 && ex[1] == 2 && ex[2] == 4);
    const int swapped[] = {2, 0};
    CHECK_EQ(nb_shrink_plan(4, swapped, 2, ex, &n), 0);
    const int newcomer[] = {0, -1};
    CHECK_EQ(nb_shrink_plan(4, newcomer, 2, ex, &n), 0);
    const int all[] = {0, 1, 2};
    CHECK_EQ(nb_shrink_plan(3, all, 3, ex, &n), 0); /* nothing to leave out: a new one */
}

int main(void)
{
    ep_err err;
    spec = spec_parse(SPEC_TEXT, strlen(SPEC_TEXT), "t.yaml", &err);
    if (spec == NULL) {
        printf("spec: %s\n", err.msg);
        return 1;
    }
    RUN(a_round_asks_rank_0_relays_its_id_and_waits_for_every_rank);
    RUN(a_late_rank_is_named_and_the_round_retried_after_a_backoff);
    RUN(one_rank_needs_no_relay_and_a_new_epoch_starts_at_generation_0);
    RUN(the_communicator_spans_the_members_and_shrinks_over_survivors);
    RUN(shrink_plans_only_ordered_subsets);
    spec_free(&spec);
    return test_report();
}
