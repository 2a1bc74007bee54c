/*
 * test_worker_welcome.c — the worker's validation of WELCOME (wctl_welcome_parse).
 *
 * Proves: a complete WELCOME becomes a session with every field carried over (rank, epoch,
 * placement, peers by rank whatever their order in the message, endpoints, dispatch format,
 * timeout, the worker's own mc_hash of the config); defaults apply where the protocol allows
 * (dispatch fp8, step timeout); and each way a WELCOME can be wrong is refused with a message
 * naming the field: missing fields, rank >= world_size, world_size 0 or too large, a config
 * that does not validate, an expert_owner table of the wrong length or naming a rank outside the
 * world, peers missing a rank, naming one twice, or without a data endpoint, no model path, no
 * data endpoint, heartbeat/liveness out of range, an unknown dispatch format, no session; with
 * security a peer without a 32-byte public key; a checkpoint file entry missing a field. The
 * session id, the peers' keys and the checkpoint fingerprint are carried over.
 */
#include <string.h>

#include "common/model_msg.h"
#include "test.h"
#include "worker/welcome.h"

#define P 3
#define E 8

typedef struct fixture {
    mc_config c;
    Epmoe__ModelConfig mc;
    Epmoe__Peer peers[P];
    Epmoe__Peer *pp[P];
    uint32_t owner[E];
    char names[P][8], eps[P][32];
    uint8_t keys[P][32];
    Epmoe__CheckpointFile files[2];
    Epmoe__CheckpointFile *fp[2];
    Epmoe__Welcome w;
} fixture;

static mc_config small_config(void)
{
    mc_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 256;
    c.moe_intermediate_size = 256;
    c.n_routed_experts = E;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 4;
    c.num_hidden_layers = 2;
    c.num_hash_layers = 1;
    c.num_nextn_predict_layers = 1;
    c.vocab_size = 1000;
    c.routed_scaling_factor = 1.5f;
    c.swiglu_limit = 10.0f;
    c.rms_norm_eps = 1e-6f;
    c.norm_topk_prob = true;
    c.expert_dtype = MC_FP4;
    c.expert_dtype_given = true;
    c.scale_e8m0 = true;
    c.act_ue8m0 = true;
    return c;
}

/* A valid WELCOME for rank 1 of 3; peers listed in the order 2, 0, 1. */
static void fixture_init(fixture *f)
{
    memset(f, 0, sizeof *f);
    f->c = small_config();
    mmsg_from_config(&f->c, &f->mc);
    for (int i = 0; i < P; i++) {
        int r = (i + 2) % P;
        snprintf(f->names[i], sizeof f->names[i], "w%d", r);
        snprintf(f->eps[i], sizeof f->eps[i], "tcp://10.0.0.%d:7500", r);
        epmoe__peer__init(&f->peers[i]);
        f->peers[i].has_rank = 1;
        f->peers[i].rank = (uint32_t)r;
        f->peers[i].name = f->names[i];
        f->peers[i].data_endpoint = f->eps[i];
        memset(f->keys[i], 0x40 + r, 32);
        f->peers[i].has_public_key = 1;
        f->peers[i].public_key.len = 32;
        f->peers[i].public_key.data = f->keys[i];
        f->pp[i] = &f->peers[i];
    }
    static const char *const files[2] = {"model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors"};
    for (int i = 0; i < 2; i++) {
        epmoe__checkpoint_file__init(&f->files[i]);
        f->files[i].name = (char *)files[i];
        f->files[i].has_size = f->files[i].has_mtime_ns = f->files[i].has_header_hash = 1;
        f->files[i].size = 1000u + (unsigned)i;
        f->files[i].mtime_ns = 1700000000123456789ll + i;
        f->files[i].header_hash = 0xABCDEF00ull + (unsigned)i;
        f->fp[i] = &f->files[i];
    }
    for (int e = 0; e < E; e++)
        f->owner[e] = (uint32_t)(e % P);
    Epmoe__Welcome w = EPMOE__WELCOME__INIT;
    w.has_rank = w.has_world_size = w.has_epoch = w.has_config_hash = 1;
    w.rank = 1;
    w.world_size = P;
    w.epoch = 42;
    w.config = &f->mc;
    w.config_hash = mc_hash(&f->c);
    w.model_path = "/models/x";
    w.n_expert_owner = E;
    w.expert_owner = f->owner;
    w.n_peers = P;
    w.peers = f->pp;
    w.has_heartbeat_ms = w.has_liveness = 1;
    w.heartbeat_ms = 1000;
    w.liveness = 3;
    w.data_endpoint = "tcp://0.0.0.0:7501";
    w.has_session = 1;
    w.session = 0x1234567890ABCDEFull;
    w.n_checkpoint = 2;
    w.checkpoint = f->fp;
    f->w = w;
}

TEST(a_complete_welcome_becomes_a_session)
{
    fixture f;
    fixture_init(&f);
    ep_err err = {{0}};
    exec_session *s = wctl_welcome_parse(&f.w, false, &err);
    CHECK(s != NULL);
    if (s == NULL) {
        printf("  %s\n", err.msg);
        return;
    }
    CHECK_EQ(s->rank, 1);
    CHECK_EQ(s->world_size, P);
    CHECK_EQ(s->epoch, 42);
    CHECK(s->config_hash == mc_hash(&f.c));
    CHECK(memcmp(&s->config, &f.c, sizeof f.c) == 0 || mc_hash(&s->config) == mc_hash(&f.c));
    for (int e = 0; e < E; e++)
        CHECK_EQ(s->expert_owner[e], e % P);
    for (int r = 0; r < P; r++) {
        char want[32];
        snprintf(want, sizeof want, "tcp://10.0.0.%d:7500", r);
        CHECK_STR_EQ(s->peer_endpoint[r], want);
        snprintf(want, sizeof want, "w%d", r);
        CHECK_STR_EQ(s->peer_name[r], want);
    }
    CHECK_STR_EQ(s->model_path, "/models/x");
    CHECK_STR_EQ(s->data_endpoint, "tcp://0.0.0.0:7501");
    CHECK_EQ(s->dispatch, TP_FMT_FP8); /* absent: fp8 */
    CHECK(!s->nccl);                   /* absent: the ZeroMQ plane */
    CHECK_EQ(s->step_timeout_ms, EXEC_DEFAULT_STEP_TIMEOUT_MS);
    CHECK(s->session == 0x1234567890ABCDEFull);
    CHECK(s->peer_key == NULL); /* without security the keys are not kept */
    CHECK_EQ(s->n_checkpoint, 2);
    if (s->n_checkpoint == 2) {
        CHECK_STR_EQ(s->checkpoint[1].name, "model-00002-of-00002.safetensors");
        CHECK_EQ(s->checkpoint[1].size, 1001);
        CHECK(s->checkpoint[1].mtime_ns == 1700000000123456790ll);
        CHECK(s->checkpoint[1].header_hash == 0xABCDEF01ull);
    }
    exec_session_free(&s);
    /* with security every rank's key is kept, by rank */
    s = wctl_welcome_parse(&f.w, true, &err);
    CHECK(s && s->peer_key != NULL);
    for (int r = 0; s && s->peer_key && r < P; r++)
        CHECK_EQ(s->peer_key[r][0], 0x40 + r);
    exec_session_free(&s);
    CHECK(s == NULL);
    f.w.has_dispatch = 1;
    f.w.dispatch = EPMOE__DISPATCH_FORMAT__DISPATCH_BF16;
    f.w.has_step_timeout_ms = 1;
    f.w.step_timeout_ms = 1234;
    s = wctl_welcome_parse(&f.w, false, &err);
    CHECK(s && s->dispatch == TP_FMT_BF16 && s->step_timeout_ms == 1234);
    exec_session_free(&s);
    f.w.has_data_plane = 1;
    f.w.data_plane = EPMOE__DATA_PLANE__DATA_PLANE_NCCL;
    s = wctl_welcome_parse(&f.w, false, &err);
    CHECK(s && s->nccl);
    exec_session_free(&s);
    /* the hash the coordinator states does not matter here: the worker acks its own */
    f.w.config_hash = 7;
    s = wctl_welcome_parse(&f.w, false, &err);
    CHECK(s && s->config_hash == mc_hash(&f.c));
    exec_session_free(&s);
}

/* Apply a mutation to a fresh valid WELCOME and expect needle in the refusal. */
#define REFUSED(mutation, needle)                                                                  \
    do {                                                                                           \
        fixture f_;                                                                                \
        fixture_init(&f_);                                                                         \
        Epmoe__Welcome *w = &f_.w;                                                                 \
        bool secure_ = false;                                                                      \
        (void)w;                                                                                   \
        mutation;                                                                                  \
        ep_err err_ = {{0}};                                                                       \
        exec_session *s_ = wctl_welcome_parse(&f_.w, secure_, &err_);                              \
        CHECK(s_ == NULL);                                                                         \
        CHECK_STR_HAS(err_.msg, needle);                                                           \
        exec_session_free(&s_);                                                                    \
    } while (0)

TEST(every_broken_field_is_named)
{
    REFUSED(w->has_rank = 0, "rank, world_size, epoch");
    REFUSED(w->config = NULL, "config");
    REFUSED(w->has_liveness = 0, "liveness and session are required");
    REFUSED(w->rank = 3, "rank 3, expected < world_size 3");
    REFUSED(w->world_size = 0, "world_size 0, expected 1..1024");
    REFUSED(w->world_size = 5000, "world_size 5000");
    REFUSED(f_.mc.hidden_size = 100, "hidden_size");
    REFUSED(f_.mc.has_n_routed_experts = 0, "n_routed_experts");
    REFUSED(w->n_expert_owner = E - 1, "expert_owner has 7 entries, expected n_routed_experts 8");
    REFUSED(f_.owner[5] = 3, "expert_owner[5] = 3, expected < world_size 3");
    REFUSED(w->n_peers = 2, "2 peers, expected one per rank");
    REFUSED(f_.peers[1].rank = 2, "rank 2 appears twice");
    REFUSED(f_.peers[0].has_rank = 0, "peers[0].rank missing");
    REFUSED(f_.peers[2].rank = 9, "peers[2].rank missing or not below world_size");
    REFUSED(f_.peers[1].data_endpoint = NULL, "peers[1] (rank 0) has no usable data_endpoint");
    REFUSED(w->model_path = "", "model_path missing");
    REFUSED(w->data_endpoint = NULL, "data_endpoint missing");
    REFUSED(w->heartbeat_ms = 1, "heartbeat_ms 1, expected 10..600000");
    REFUSED(w->liveness = 0, "liveness 0, expected 1..100");
    REFUSED((w->has_dispatch = 1, w->dispatch = (Epmoe__DispatchFormat)7), "dispatch 7");
    REFUSED((w->has_step_timeout_ms = 1, w->step_timeout_ms = 0), "step_timeout_ms 0");
    REFUSED(w->has_session = 0, "session are required");
    REFUSED((secure_ = true, f_.peers[1].has_public_key = 0), "peer rank 0 has no 32-byte");
    REFUSED((secure_ = true, f_.peers[2].public_key.len = 31), "peer rank 1 has no 32-byte");
    REFUSED(f_.files[1].has_header_hash = 0, "checkpoint[1] needs a name");
    REFUSED(f_.files[0].name = "", "checkpoint[0] needs a name");
    REFUSED((w->has_data_plane = 1, w->data_plane = (Epmoe__DataPlane)5), "data_plane 5");
}

TEST(a_peer_without_a_name_gets_one)
{
    fixture f;
    fixture_init(&f);
    f.peers[0].name = NULL; /* rank 2 */
    ep_err err = {{0}};
    exec_session *s = wctl_welcome_parse(&f.w, false, &err);
    CHECK(s && strcmp(s->peer_name[2], "rank2") == 0);
    exec_session_free(&s);
}

int main(void)
{
    RUN(a_complete_welcome_becomes_a_session);
    RUN(every_broken_field_is_named);
    RUN(a_peer_without_a_name_gets_one);
    return test_report();
}
