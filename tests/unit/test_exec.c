/*
 * test_exec.c — the step executor actor (worker/exec.h) driven directly over its pipe.
 *
 * Proves:
 *  - exec_start fails with a message, and never waits, when the pipe's sockets cannot be
 *    created (a context out of sockets); before, the thread died silently and exec_start waited
 *    for its "started" signal for ever;
 *  - a pipe message with a small body (an EXEC_CMD_SESSION: 8 bytes, kept inside its zmq_msg_t)
 *    that arrives while a step waits for a peer is stashed and handled intact after the step:
 *    the new session is the one sent (its model path shows up in the next LOAD's error); before,
 *    the stash copied the wire_msg by value and its body pointed into a dead stack frame;
 *  - a STEP without the session, or with another session's id, fails ERR_BAD_REQUEST; a STEP
 *    whose hidden states hold a NaN or an Inf fails ERR_BAD_REQUEST naming the token and channel;
 *  - LOAD refuses a checkpoint whose files differ from the session's fingerprint, naming the
 *    file and what differs (size, modification time);
 *  - a new session over the same path and config keeps the loaded experts only while the files
 *    are the ones they were read from: after the checkpoint was rewritten (a new modification
 *    time) every expert is read again; before, the old experts were kept and mixed with the new
 *    checkpoint's router tensors;
 *  - a checkpoint file truncated after it was opened (a shard rewritten under a loading worker)
 *    fails the layer's load with a message naming the file, where it now ends and the tensor;
 *    before, the loader read the mapping past the file's end and the process died of SIGBUS.
 */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/safetensors_model.h"
#include "common/wire.h"
#include "moe_gen.h"
#include "test.h"
#include "worker/exec.h"
#include "shard/shard.h"

#define SESSION 0xABCDEF0123456789ull
#define WAIT_MS 30000

static mc_config cfg;
static char model_dir[64];
static bool have_model;

/* Rank 0 of two; rank 1's endpoint has nobody behind it, so a step waits until aborted. */
static exec_session *two_rank_session(const char *model_path)
{
    exec_session *s = exec_session_new(cfg.n_routed_experts, 2);
    s->config = cfg;
    s->config_hash = mc_hash(&cfg);
    s->rank = 0;
    s->epoch = 3;
    s->session = SESSION;
    snprintf(s->model_path, sizeof s->model_path, "%s", model_path);
    snprintf(s->data_endpoint, sizeof s->data_endpoint, "tcp://127.0.0.1:*");
    uint32_t owner[64];
    for (int e = 0; e < cfg.n_routed_experts; e++)
        owner[e] = (uint32_t)(e * 2 / cfg.n_routed_experts);
    exec_set_placement(s, owner, NULL, 0); /* every rank a member */
    /* nobody binds rank 1's endpoint (an ipc path that does not exist) */
    s->peer_endpoint[0] = strdup("tcp://127.0.0.1:1");
    s->peer_endpoint[1] = strdup("ipc:///tmp/epmoe_test_exec_nobody_listens");
    s->peer_name[0] = strdup("w0");
    s->peer_name[1] = strdup("w1");
    s->dispatch = TP_FMT_FP8;
    s->step_timeout_ms = WAIT_MS;
    return s;
}

/* The next message of type want from the executor (others skipped); its decoded body via
 * desc into *out (may be NULL). 0, or -1 on timeout or a wire error. */
static int expect(exec_actor *a, uint16_t want, const ProtobufCMessageDescriptor *desc,
                  ProtobufCMessage **out)
{
    for (int waited = 0; waited < WAIT_MS; waited += 100) {
        zmq_pollitem_t it = {.socket = exec_pipe(a), .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        wire_msg m;
        ep_err err;
        if (wire_recv(exec_pipe(a), false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, 0, &m, &err) !=
            WIRE_OK)
            return -1;
        int got = m.type == want;
        if (got && desc && out)
            *out = wire_unpack(desc, &m, &err);
        if (!got)
            printf("  (skipping %s)\n", wire_type_name(m.type));
        wire_msg_close(&m);
        if (got)
            return 0;
    }
    printf("  timeout waiting for %s\n", wire_type_name(want));
    return -1;
}

static void send_load(exec_actor *a)
{
    Epmoe__Load l = EPMOE__LOAD__INIT;
    l.has_epoch = 1;
    l.epoch = 3;
    CHECK(wire_send(exec_pipe(a), NULL, 0, EPMOE__MSG_TYPE__MSG_LOAD, &l.base, NULL, 0, false,
                    NULL) == 0);
}

static void send_step(exec_actor *a, uint64_t id, bool has_session, uint64_t session,
                      const uint16_t *x, int T)
{
    Epmoe__Step s = EPMOE__STEP__INIT;
    s.has_step_id = s.has_epoch = s.has_layer = s.has_n_tokens = s.has_has_ids = 1;
    s.step_id = id;
    s.epoch = 3;
    s.layer = 1; /* a score layer: no ids */
    s.n_tokens = (uint32_t)T;
    s.has_session = has_session;
    s.session = session;
    wire_payload p = {.data = x, .len = (size_t)T * (size_t)cfg.hidden_size * 2};
    CHECK(wire_send(exec_pipe(a), NULL, 0, EPMOE__MSG_TYPE__MSG_STEP, &s.base, &p, 1, false,
                    NULL) == 0);
}

/* STEP_FAILED for step id: its code, its message into buf. */
static int expect_failed(exec_actor *a, uint64_t id, char *buf, size_t cap)
{
    Epmoe__StepFailed *f = NULL;
    if (expect(a, EPMOE__MSG_TYPE__MSG_STEP_FAILED, &epmoe__step_failed__descriptor,
               (ProtobufCMessage **)&f) != 0 ||
        f == NULL)
        return -1;
    CHECK(f->has_step_id && f->step_id == id);
    snprintf(buf, cap, "%s", f->message ? f->message : "");
    int code = f->has_code ? (int)f->code : -1;
    wire_free_unpacked(&f->base);
    return code;
}

static void *the_ctx;

/* An executor on a one-thread CPU backend. */
static exec_actor *start_exec(void *ctx, ep_err *err)
{
    mb_options o = {.device = "cpu", .threads = 1};
    mb_backend *be = mb_create(&o, err);
    if (be == NULL)
        return NULL;
    return exec_start(ctx, &be, NULL, err);
}

/* A fresh executor with a two-rank session over the test model, loaded (READY). */
static exec_actor *loaded_executor(void)
{
    ep_err err = {0};
    exec_actor *a = start_exec(the_ctx, &err);
    if (a == NULL) {
        TEST_FAIL_AT("exec_start: %s", err.msg);
        return NULL;
    }
    exec_session *s = two_rank_session(model_dir);
    CHECK(exec_send_session(a, &s, &err) == 0);
    send_load(a);
    if (expect(a, EPMOE__MSG_TYPE__MSG_READY, NULL, NULL) != 0) {
        TEST_FAIL_AT("no READY");
        exec_stop(&a);
    }
    return a;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "  exec_start did not return within 10 s: it hangs\nFAIL\n";
    ssize_t rc = write(1, msg, sizeof msg - 1);
    (void)rc;
    _exit(1);
}

TEST(exec_start_fails_instead_of_hanging)
{
    void *ctx = zmq_ctx_new();
    /* room for the caller's end of the pipe only */
    CHECK(zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, 1) == 0);
    ep_err err = {0};
    signal(SIGALRM, on_alarm);
    alarm(10);
    exec_actor *a = start_exec(ctx, &err);
    alarm(0);
    CHECK(a == NULL);
    CHECK_STR_HAS(err.msg, "executor pipe");
    exec_stop(&a);
    zmq_ctx_term(ctx);
}

TEST(a_small_message_stashed_during_a_step_arrives_intact)
{
    if (!have_model)
        SKIP("no model");
    exec_actor *a = loaded_executor();
    if (a == NULL)
        return;
    int T = 5, H = cfg.hidden_size;
    uint16_t *x = calloc((size_t)T * H, 2);
    for (int i = 0; i < T * H; i++)
        x[i] = (uint16_t)(0x3F80 + (i % 7)); /* ~1.0 */
    send_step(a, 1, true, SESSION, x, T);
    usleep(200000); /* the step now waits for rank 1 */
    /* a new session while the step waits: an 8-byte body, stashed until the step is over */
    ep_err err = {0};
    exec_session *s2 = two_rank_session("/nonexistent/epmoe-stash-test");
    CHECK(exec_send_session(a, &s2, &err) == 0);
    Epmoe__StepAbort ab = EPMOE__STEP_ABORT__INIT;
    ab.has_step_id = 1;
    ab.step_id = 1;
    CHECK(wire_send(exec_pipe(a), NULL, 0, EPMOE__MSG_TYPE__MSG_STEP_ABORT, &ab.base, NULL, 0,
                    false, NULL) == 0);
    char text[1024];
    CHECK_EQ(expect_failed(a, 1, text, sizeof text), EPMOE__ERROR_CODE__ERR_STEP_FAILED);
    CHECK_STR_HAS(text, "aborted");
    /* the stashed session is the one sent: its (missing) model is what LOAD now opens */
    send_load(a);
    Epmoe__Error *e = NULL;
    CHECK(expect(a, EPMOE__MSG_TYPE__MSG_ERROR, &epmoe__error__descriptor,
                 (ProtobufCMessage **)&e) == 0);
    CHECK(e && e->has_code && e->code == EPMOE__ERROR_CODE__ERR_LOAD_FAILED);
    CHECK_STR_HAS(e && e->message ? e->message : "", "/nonexistent/epmoe-stash-test");
    wire_free_unpacked(e ? &e->base : NULL);
    free(x);
    exec_stop(&a);
}

TEST(steps_need_the_session_and_finite_hidden_states)
{
    if (!have_model)
        SKIP("no model");
    exec_actor *a = loaded_executor();
    if (a == NULL)
        return;
    int T = 3, H = cfg.hidden_size;
    uint16_t *x = calloc((size_t)T * H, 2);
    char text[1024];
    send_step(a, 1, false, 0, x, T);
    CHECK_EQ(expect_failed(a, 1, text, sizeof text), EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    CHECK_STR_HAS(text, "session, epoch, layer or n_tokens missing");
    send_step(a, 2, true, SESSION ^ 1, x, T);
    CHECK_EQ(expect_failed(a, 2, text, sizeof text), EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    CHECK_STR_HAS(text, "this worker was welcomed into abcdef0123456789");
    x[(size_t)2 * H + 17] = 0x7FC0; /* NaN */
    send_step(a, 3, true, SESSION, x, T);
    CHECK_EQ(expect_failed(a, 3, text, sizeof text), EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    CHECK_STR_HAS(text, "token 2, channel 17: the hidden state is NaN");
    x[(size_t)2 * H + 17] = 0;
    x[5] = 0xFF80; /* -Inf */
    send_step(a, 4, true, SESSION, x, T);
    CHECK_EQ(expect_failed(a, 4, text, sizeof text), EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    CHECK_STR_HAS(text, "token 0, channel 5: the hidden state is Inf");
    free(x);
    exec_stop(&a);
}

TEST(load_refuses_files_that_differ_from_the_fingerprint)
{
    if (!have_model)
        SKIP("no model");
    ep_err err = {0};
    st_model *m = st_model_open(model_dir, &err);
    CHECK(m != NULL);
    if (m == NULL)
        return;
    st_file_print p;
    st_model_print(m, 0, &p);
    st_model_close(&m);
    static const char *const want[3] = {"bytes here", "modified", NULL};
    for (int i = 0; i < 3; i++) {
        exec_actor *a = start_exec(the_ctx, &err);
        CHECK(a != NULL);
        if (a == NULL)
            return;
        exec_session *s = two_rank_session(model_dir);
        s->checkpoint = calloc(1, sizeof *s->checkpoint);
        s->checkpoint[0] = p;
        s->n_checkpoint = 1;
        if (i == 0)
            s->checkpoint[0].size += 1; /* the coordinator saw another file */
        if (i == 1)
            s->checkpoint[0].mtime_ns -= 1000000000;
        CHECK(exec_send_session(a, &s, &err) == 0);
        send_load(a);
        if (want[i] == NULL) { /* the fingerprint of the files as they are: loads */
            CHECK(expect(a, EPMOE__MSG_TYPE__MSG_READY, NULL, NULL) == 0);
        } else {
            Epmoe__Error *e = NULL;
            CHECK(expect(a, EPMOE__MSG_TYPE__MSG_ERROR, &epmoe__error__descriptor,
                         (ProtobufCMessage **)&e) == 0);
            const char *msg = e && e->message ? e->message : "";
            CHECK_STR_HAS(msg, "model.safetensors");
            CHECK_STR_HAS(msg, want[i]);
            CHECK_STR_HAS(msg, "restart the coordinator");
            wire_free_unpacked(e ? &e->base : NULL);
        }
        exec_stop(&a);
    }
}

/* READY's experts_kept after a new session and LOAD, or -1. */
static int reload_kept(exec_actor *a)
{
    ep_err err = {0};
    exec_session *s = two_rank_session(model_dir);
    CHECK(exec_send_session(a, &s, &err) == 0);
    send_load(a);
    Epmoe__Ready *r = NULL;
    if (expect(a, EPMOE__MSG_TYPE__MSG_READY, &epmoe__ready__descriptor, (ProtobufCMessage **)&r) !=
            0 ||
        r == NULL)
        return -1;
    int kept = r->has_experts_kept ? (int)r->experts_kept : -1;
    wire_free_unpacked(&r->base);
    return kept;
}

TEST(loaded_experts_are_kept_only_while_the_files_are_the_same)
{
    if (!have_model)
        SKIP("no model");
    exec_actor *a = loaded_executor();
    if (a == NULL)
        return;
    int owned = cfg.n_routed_experts / 2;
    CHECK_EQ(reload_kept(a), owned); /* the same files: nothing is read again */
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    struct timespec t[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = 1000000000}};
    CHECK(utimensat(AT_FDCWD, path, t, 0) == 0); /* rewritten, as far as anyone can tell */
    CHECK_EQ(reload_kept(a), 0);
    CHECK_EQ(reload_kept(a), owned);
    exec_stop(&a);
}

TEST(a_checkpoint_truncated_while_loading_fails_with_a_message)
{
    if (!have_model)
        SKIP("no model");
    char dir[] = "/tmp/epmoe_test_exec_trunc_XXXXXX", src[160], dst[160];
    CHECK(mkdtemp(dir) != NULL);
    static const char *const files[2] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(src, sizeof src, "%s/%s", model_dir, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "cp %s %s", src, dst);
        CHECK(system(cmd) == 0);
    }
    ep_err err = {0};
    st_model *m = st_model_open(dir, &err);
    CHECK(m != NULL);
    /* the file shrinks to a third under the open model: its mapping now ends early */
    struct stat sb;
    CHECK(stat(dst, &sb) == 0);
    CHECK(truncate(dst, sb.st_size / 3) == 0);
    int faults = 0;
    for (int l = 0; m && l < mc_num_layers(&cfg); l++) {
        moe_layer *layer = shard_load_moe_layer(m, &cfg, l, NULL, ISA_AUTO, &err);
        if (layer == NULL) {
            faults++;
            CHECK_STR_HAS(err.msg, "model.safetensors: the file ends at byte");
            CHECK_STR_HAS(err.msg, "truncated or replaced while being read");
            CHECK_STR_HAS(err.msg, ": tensor ");
        }
        moe_layer_free(&layer);
    }
    CHECK(faults >= 1); /* the layers past the new end fail, the process lives */
    st_model_close(&m);
    unlink(dst);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    unlink(dst);
    rmdir(dir);
}

int main(void)
{
    the_ctx = zmq_ctx_new();
    cfg = gen_config(MC_FP4, 256, 256, 8, 4, 1000);
    cfg.num_hidden_layers = 2;
    ep_err err = {0};
    gen_opts go = {.seed = 5};
    gen_model *g = gen_model_create(&cfg, &go);
    snprintf(model_dir, sizeof model_dir, "/tmp/epmoe_test_exec_XXXXXX");
    have_model = g && mkdtemp(model_dir) && gen_model_write(g, model_dir, &err) == 0;
    if (!have_model)
        printf("  model: %s\n", err.msg);
    gen_model_free(&g);
    RUN(exec_start_fails_instead_of_hanging);
    RUN(a_small_message_stashed_during_a_step_arrives_intact);
    RUN(steps_need_the_session_and_finite_hidden_states);
    RUN(load_refuses_files_that_differ_from_the_fingerprint);
    RUN(loaded_experts_are_kept_only_while_the_files_are_the_same);
    RUN(a_checkpoint_truncated_while_loading_fails_with_a_message);
    gen_model_remove(model_dir);
    zmq_ctx_term(the_ctx);
    return test_report();
}
