/*
 * fuzz_admin.c — the coordinator's admin requests on arbitrary frames: adm_parse, then for a
 * FORWARD the sequencer's admission (seq_submit: layer, token count, payload sizes, ids, finite
 * hidden states, the queue's count and byte bounds), for SHARDS the layer check.
 *
 * Model: H 128, 4 experts, top-2, 2 main layers (layer 0 hash-routed) and 1 MTP layer, vocab
 * 64; one worker. Input: frames (fuzz_frames.h). Properties: nothing crashes, leaks or reads
 * outside the input; every request is answered (a reply or an error is queued) unless it is
 * queued itself; a queued request keeps the queue within its bounds.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "coordinator/admin.h"
#include "coordinator/planner.h"
#include "coordinator/sequencer.h"
#include "coordinator/spec.h"
#include "common/log.h"
#include "fuzz_frames.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CONFIG[] =
    "{\"hidden_size\": 128, \"moe_intermediate_size\": 128, \"n_routed_experts\": 4,"
    " \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2,"
    " \"num_hash_layers\": 1, \"num_nextn_predict_layers\": 1, \"vocab_size\": 64,"
    " \"routed_scaling_factor\": 1, \"swiglu_limit\": 10, \"rms_norm_eps\": 1e-6,"
    " \"scoring_func\": \"sqrtsoftplus\"}";

static const char SPEC[] = "cluster: {name: f}\n"
                           "coordinator: {listen: \"tcp://127.0.0.1:1\", admin: \"ipc://a\"}\n"
                           "model: {path: /m}\n"
                           "nodes:\n  - name: n\n    workers:\n"
                           "      - {name: w0, device: cpu, data: \"tcp://127.0.0.1:2\"}\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_level(LOG_ERROR); /* a dropped or refused message is the expected case here */
    static mc_config cfg;
    static spec_cluster *spec;
    static plan_table *plan;
    ep_err err;
    if (spec == NULL) {
        if (mc_parse(CONFIG, strlen(CONFIG), "cfg.json", &cfg, &err) != 0 ||
            (spec = spec_parse(SPEC, strlen(SPEC), "f.yaml", &err)) == NULL ||
            (plan = plan_for_spec(spec, &cfg, 1, &err)) == NULL)
            abort();
    }
    wire_msg *m = fuzz_message(data, size);
    if (m == NULL)
        return 0;
    ob_box out = {0};
    Epmoe__AdminRequest *rq = adm_parse(m, &out);
    if (rq == NULL) {
        /* refused, and answered (an Error is never answered with an Error) */
        if (out.n_msg != (m->type == EPMOE__MSG_TYPE__MSG_ERROR ? 0 : 1))
            abort();
    } else if (rq->verb == EPMOE__ADMIN_VERB__ADMIN_FORWARD) {
        /* 1 MiB of room: a few of the requests this model allows fit */
        seq_sequencer *s = seq_create(1, 1, 1u << 20, &err);
        seq_env env = {.spec = spec,
                       .cfg = &cfg,
                       .plan = plan,
                       .state = "loading",
                       .wait = true,
                       .not_ready = "w0 (loading)"};
        seq_submit(s, &env, m, rq, &out); /* takes m and rq */
        m = NULL;
        if (seq_queued(s) + out.n_msg != 1)
            abort();
        seq_stop(s, &out);
        seq_destroy(&s);
    } else {
        if (rq->verb == EPMOE__ADMIN_VERB__ADMIN_SHARDS && rq->layer != NULL) {
            int layer;
            ck_layer_parse(&cfg, rq->layer, &layer, &err);
        }
        wire_free_unpacked(&rq->base);
    }
    ob_free(&out);
    if (m != NULL) {
        wire_msg_close(m);
        free(m);
    }
    return 0;
}
