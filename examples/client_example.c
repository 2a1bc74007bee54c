/*
 * client_example.c — the smallest complete libepmoe program (docs/client.md): connect to a
 * cluster, print what it serves, submit one request per MoE layer (all in flight at once),
 * wait for each and print its answer.
 *
 *   cc client_example.c $(pkg-config --cflags --libs epmoe) -o client_example
 *   ./client_example tcp://127.0.0.1:7401 [TOKENS]
 *
 * With a security: cluster set EPMOE_CLIENT_SECRET (this client's secret key) and
 * EPMOE_SERVER_PUBLIC (the coordinator's public key), both Z85 text.
 * Exit status: 0 when every layer answered, 1 otherwise, 2 for a usage error. Every call's
 * return is checked: an engine does the same (the status says what to do, the message where).
 * Installed with the header (share/doc/epmoe/examples/); docs/client.md builds it.
 */
#include <epmoe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* bf16 bits of a float (round to nearest even; the inputs here are finite). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef struct layer_call {
    uint16_t *hidden, *out;
    int64_t *ids;
    int32_t *topk_ids;
    float *topk_weights;
    epmoe_request *req;
} layer_call;

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s COORDINATOR_ADMIN_ENDPOINT [TOKENS]\n", argv[0]);
        return 2;
    }
    uint32_t T = argc > 2 ? (uint32_t)atoi(argv[2]) : 4;
    if (T == 0) {
        fprintf(stderr, "%s: TOKENS: expected a positive number, got \"%s\"\n", argv[0], argv[2]);
        return 2;
    }
    /* the library loaded is the one compiled against (same major and minor) */
    if (epmoe_version_number() / 100 != EPMOE_VERSION_NUMBER / 100) {
        fprintf(stderr, "libepmoe %s loaded; this program was built against %d\n", epmoe_version(),
                EPMOE_VERSION_NUMBER);
        return 1;
    }
    epmoe_options o = EPMOE_OPTIONS_INIT;
    o.coordinator = argv[1];
    o.client_secret_key = getenv("EPMOE_CLIENT_SECRET");
    o.server_key = getenv("EPMOE_SERVER_PUBLIC");
    epmoe_client *c = NULL;
    epmoe_error err;
    int rc = epmoe_open(&o, &c, &err);
    if (rc != EPMOE_OK) {
        fprintf(stderr, "epmoe_open: %s: %s\n", epmoe_strerror(rc), err.message);
        return 1;
    }
    epmoe_info info;
    rc = epmoe_info_get(c, &info, &err);
    epmoe_member *members = rc == EPMOE_OK ? calloc(info.n_members + 1, sizeof *members) : NULL;
    uint32_t n_members = 0;
    if (rc == EPMOE_OK && members == NULL)
        rc = EPMOE_ENOMEM;
    if (rc == EPMOE_OK)
        rc = epmoe_info_members(c, members, info.n_members, &n_members, &err);
    if (rc != EPMOE_OK) {
        fprintf(stderr, "epmoe_info: %s: %s\n", epmoe_strerror(rc), err.message);
        free(members);
        epmoe_close(&c);
        return 1;
    }
    if (n_members > info.n_members) /* one joined since epmoe_info_get */
        n_members = info.n_members;
    printf("libepmoe %s: H %u, %u MoE layers (%u main, first %u hashed), top-%u of %u %s "
           "experts, config %016llx, epoch %llu, %u members\n",
           epmoe_version(), info.hidden_size, info.n_layers, info.n_main_layers, info.n_hash_layers,
           info.topk, info.n_experts, info.expert_dtype, (unsigned long long)info.config_hash,
           (unsigned long long)info.epoch, n_members);
    for (uint32_t i = 0; i < n_members; i++)
        printf("  %s (rank %u): %s%s\n", members[i].name, members[i].rank,
               members[i].client_endpoint[0] ? members[i].client_endpoint : "no client endpoint",
               members[i].ready ? ", ready" : "");
    free(members);
    size_t H = info.hidden_size, K = info.topk;
    layer_call *calls = calloc(info.n_layers, sizeof *calls);
    if (calls == NULL) {
        fprintf(stderr, "out of memory\n");
        epmoe_close(&c);
        return 1;
    }
    int failed = 0;
    /* one request per layer, all in flight at once (the default max_in_flight is 64) */
    for (uint32_t l = 0; l < info.n_layers; l++) {
        layer_call *k = &calls[l];
        k->hidden = malloc(T * H * sizeof *k->hidden);
        k->out = malloc(T * H * sizeof *k->out);
        k->ids = malloc(T * sizeof *k->ids);
        k->topk_ids = malloc(T * K * sizeof *k->topk_ids);
        k->topk_weights = malloc(T * K * sizeof *k->topk_weights);
        if (!k->hidden || !k->out || !k->ids || !k->topk_ids || !k->topk_weights) {
            fprintf(stderr, "layer %u: out of memory for %u tokens\n", l, T);
            failed++;
            continue;
        }
        for (size_t i = 0; i < T * H; i++)
            k->hidden[i] = to_bf16(0.01f * (float)((i * 7 + l * 13) % 101) - 0.5f);
        for (uint32_t t = 0; t < T; t++)
            k->ids[t] = (int64_t)((t * 31 + l) % (info.vocab_size ? info.vocab_size : 1));
        epmoe_submit_args a = EPMOE_SUBMIT_ARGS_INIT;
        a.layer = l;
        a.n_tokens = T;
        a.hidden_size = info.hidden_size; /* what the buffers were sized for */
        a.config_hash = info.config_hash;
        a.hidden = k->hidden;
        a.token_ids = k->ids;
        a.out = k->out;
        a.topk_ids = k->topk_ids;
        a.topk_weights = k->topk_weights;
        rc = epmoe_submit(c, &a, &k->req, &err);
        if (rc != EPMOE_OK) {
            fprintf(stderr, "layer %u: epmoe_submit: %s: %s\n", l, epmoe_strerror(rc), err.message);
            failed++;
        }
    }
    for (uint32_t l = 0; l < info.n_layers; l++) {
        layer_call *k = &calls[l];
        if (k->req != NULL) {
            rc = epmoe_wait(k->req, -1, &err);
            epmoe_request_info ri;
            if (rc == EPMOE_OK && epmoe_request_status(k->req, &ri) != EPMOE_OK)
                rc = EPMOE_EINVAL;
            if (rc == EPMOE_OK)
                printf("layer %u: ok from %s in epoch %llu, %.3f ms; out[0][0..2] = %g %g %g, "
                       "token 0 -> expert %d (%.4f)\n",
                       l, ri.entry, (unsigned long long)ri.epoch, ri.total_s * 1e3,
                       from_bf16(k->out[0]), from_bf16(k->out[1]), from_bf16(k->out[2]),
                       k->topk_ids[0], k->topk_weights[0]);
            else
                fprintf(stderr, "layer %u: %s: %s\n", l, epmoe_strerror(rc), err.message);
            failed += rc != EPMOE_OK;
            epmoe_request_free(&k->req);
        }
        free(k->hidden);
        free(k->out);
        free(k->ids);
        free(k->topk_ids);
        free(k->topk_weights);
    }
    free(calls);
    epmoe_close(&c);
    return failed ? 1 : 0;
}
