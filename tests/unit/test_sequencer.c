/*
 * test_sequencer.c — the forward queue's admission (coordinator/sequencer.h), driven directly.
 *
 * Proves: the requests waiting behind a step are bounded in bytes as well as in count (before,
 * 64 requests of 65,536 tokens could hold 2 GiB at H = 256): with a bound of 3.5 requests'
 * frames, three are queued and the fourth is refused with ERR_BUSY naming the bytes and the
 * bound, and once the queue drains (a stop) the room is back; a FORWARD whose hidden states
 * hold a NaN or an Inf is refused with ERR_BAD_REQUEST naming the token and the channel.
 * A request that will be refused costs no look at its values: with the queue full, or the
 * cluster not ready, a request holding a NaN is refused as busy or not ready (the value scan,
 * O(payload), comes after every cheaper refusal; a flood of large refused forwards once held up
 * the coordinator's heartbeats).
 */
#include <string.h>

#include "common/model_config.h"
#include "coordinator/admin.h"
#include "coordinator/planner.h"
#include "coordinator/sequencer.h"
#include "coordinator/spec.h"
#include "test.h"

#define T 64
#define H 128

static const char CONFIG[] =
    "{\"hidden_size\": 128, \"moe_intermediate_size\": 128, \"n_routed_experts\": 2,"
    " \"n_shared_experts\": 1, \"num_experts_per_tok\": 1, \"num_hidden_layers\": 2,"
    " \"num_hash_layers\": 0, \"vocab_size\": 100, \"routed_scaling_factor\": 1,"
    " \"swiglu_limit\": 10, \"rms_norm_eps\": 1e-6, \"scoring_func\": \"sqrtsoftplus\"}";

static const char SPEC[] = "cluster: {name: s}\n"
                           "coordinator: {listen: \"tcp://127.0.0.1:1\", admin: \"ipc://a\"}\n"
                           "model: {path: /m}\n"
                           "nodes:\n  - name: n\n    workers:\n"
                           "      - {name: w0, device: cpu, data: \"tcp://127.0.0.1:2\"}\n";

static uint16_t hidden[T * H];

/* A FORWARD of layer 1 with T tokens, as seq_submit takes it. */
static void submit(seq_sequencer *s, const seq_env *env, uint64_t id, ob_box *out)
{
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_id = rq.has_verb = rq.has_n_tokens = 1;
    rq.id = id;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = "1";
    rq.n_tokens = T;
    uint8_t body[64];
    size_t blen = protobuf_c_message_pack(&rq.base, body);
    uint8_t type[2] = {EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, 0};
    const uint8_t *f[4] = {(const uint8_t *)WIRE_VERSION, type, body, (const uint8_t *)hidden};
    size_t l[4] = {strlen(WIRE_VERSION), 2, blen, sizeof hidden};
    wire_msg *m = malloc(sizeof *m);
    ep_err err;
    CHECK(wire_msg_from_frames(m, f, l, 4, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, &err) == 0);
    Epmoe__AdminRequest *req =
        (Epmoe__AdminRequest *)wire_unpack(&epmoe__admin_request__descriptor, m, &err);
    seq_submit(s, env, m, req, out);
}

/* The last reply in out: its error code, its text in buf. -1 when the last message is not an
 * AdminReply with ok false. */
static int last_error(const ob_box *out, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (out->n_msg == 0)
        return -1;
    const ob_msg *m = &out->msg[out->n_msg - 1];
    Epmoe__AdminReply *r = epmoe__admin_reply__unpack(NULL, m->body_len, m->body);
    int code = r && !r->ok && r->has_error_code ? (int)r->error_code : -1;
    snprintf(buf, cap, "%s", r && r->error ? r->error : "");
    epmoe__admin_reply__free_unpacked(r, NULL);
    return code;
}

TEST(the_queue_is_bounded_in_bytes)
{
    ep_err err = {0};
    mc_config cfg;
    CHECK(mc_parse(CONFIG, strlen(CONFIG), "cfg.json", &cfg, &err) == 0);
    spec_cluster *spec = spec_parse(SPEC, strlen(SPEC), "s.yaml", &err);
    plan_table *plan = spec ? plan_for_spec(spec, &cfg, 5, &err) : NULL;
    CHECK(spec && plan);
    if (!spec || !plan) {
        printf("  %s\n", err.msg);
        return;
    }
    /* a request holds its hidden payload (16 KiB) and a body of a few bytes */
    uint64_t one = sizeof hidden + 16, bound = 3 * one + one / 2;
    seq_sequencer *s = seq_create(1, 1000, bound, &err);
    /* not ready but waiting for an epoch: requests queue and nothing starts */
    seq_env env = {.spec = spec,
                   .cfg = &cfg,
                   .plan = plan,
                   .state = "loading",
                   .wait = true,
                   .not_ready = "w0 (loading)"};
    ob_box out = {0};
    char text[1024];
    for (uint64_t id = 1; id <= 3; id++)
        submit(s, &env, id, &out);
    CHECK_EQ(seq_queued(s), 3);
    CHECK_EQ(out.n_msg, 0); /* no reply yet: all three wait */
    submit(s, &env, 4, &out);
    CHECK_EQ(seq_queued(s), 3);
    CHECK_EQ(last_error(&out, text, sizeof text), EPMOE__ERROR_CODE__ERR_BUSY);
    CHECK_STR_HAS(text, "the 3 queued forward requests hold");
    CHECK_STR_HAS(text, "would pass the bound");
    CHECK_STR_HAS(text, "EP_MAX_QUEUED_BYTES");
    /* a stop answers the three; the room is back */
    seq_stop(s, &out);
    CHECK_EQ(seq_queued(s), 0);
    submit(s, &env, 5, &out);
    CHECK_EQ(seq_queued(s), 1);
    /* a NaN in token 9, channel 3 */
    hidden[9 * H + 3] = 0x7FC1;
    int before = out.n_msg;
    submit(s, &env, 6, &out);
    CHECK_EQ(out.n_msg, before + 1);
    CHECK_EQ(last_error(&out, text, sizeof text), EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    CHECK_STR_HAS(text, "FORWARD: token 9, channel 3: the hidden state is NaN");
    hidden[9 * H + 3] = 0;
    CHECK_EQ(seq_queued(s), 1);
    seq_destroy(&s);
    ob_free(&out);
    plan_free(&plan);
    spec_free(&spec);
}

TEST(a_refused_request_costs_no_value_scan)
{
    ep_err err = {0};
    mc_config cfg;
    CHECK(mc_parse(CONFIG, strlen(CONFIG), "cfg.json", &cfg, &err) == 0);
    spec_cluster *spec = spec_parse(SPEC, strlen(SPEC), "s.yaml", &err);
    plan_table *plan = spec ? plan_for_spec(spec, &cfg, 5, &err) : NULL;
    CHECK(spec && plan);
    if (!spec || !plan)
        return;
    uint64_t one = sizeof hidden + 16;
    seq_sequencer *s = seq_create(1, 1000, one, &err);
    seq_env env = {.spec = spec,
                   .cfg = &cfg,
                   .plan = plan,
                   .state = "loading",
                   .wait = true,
                   .not_ready = "w0 (loading)"};
    ob_box out = {0};
    char text[1024];
    submit(s, &env, 1, &out); /* the queue is full with this one */
    CHECK_EQ(seq_queued(s), 1);
    hidden[9 * H + 3] = 0x7FC1; /* a NaN: only a value scan would see it */
    submit(s, &env, 2, &out);
    CHECK_EQ(last_error(&out, text, sizeof text), EPMOE__ERROR_CODE__ERR_BUSY);
    CHECK_STR_HAS(text, "EP_MAX_QUEUED_BYTES");
    env.wait = false; /* not ready, and no epoch on its way */
    submit(s, &env, 3, &out);
    CHECK_EQ(last_error(&out, text, sizeof text), EPMOE__ERROR_CODE__ERR_NOT_READY);
    CHECK_STR_HAS(text, "w0 (loading)");
    /* the sizes are checked before readiness: a wrong request is told what is wrong */
    env.wait = true;
    seq_stop(s, &out);
    submit(s, &env, 4, &out);
    CHECK_EQ(last_error(&out, text, sizeof text), EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    CHECK_STR_HAS(text, "the hidden state is NaN");
    hidden[9 * H + 3] = 0;
    CHECK_EQ(seq_queued(s), 0);
    seq_destroy(&s);
    ob_free(&out);
    plan_free(&plan);
    spec_free(&spec);
}

int main(void)
{
    RUN(the_queue_is_bounded_in_bytes);
    RUN(a_refused_request_costs_no_value_scan);
    return test_report();
}
