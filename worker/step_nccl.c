/*
 * step_nccl.c — one MoE step over the collective plane (see step_nccl.h).
 *
 * Memory: two device workspaces and two pinned host workspaces, kept across steps and grown
 * when a step needs more (allocations are slow and would synchronise the device). The "A"
 * pair holds what is known before the counts arrive (counts slots, row and slot lists, the
 * blocks this rank sends, the COMBINE rows it receives); the "B" pair what the counts size (the
 * blocks it receives, their pairs on the host, the COMBINE rows it sends). Growing B therefore
 * never moves anything already uploaded. Every region starts at a 256-byte boundary.
 *
 * Order on the stream is the only synchronisation between the device operations; the host
 * waits (through the communicator, with the step's deadline) only where it needs data: the
 * counts, and the received pairs it validates and plans the experts with.
 */
#include "worker/step_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "common/log.h"
#include "common/wire.h"
#include "epmoe.pb-c.h"
#include "worker/plan.h"

#define SN_ALIGN 256

typedef struct sn_buf {
    void *p;
    size_t cap;
} sn_buf;

struct sn_driver {
    sn_config cfg;
    int P, me;         /* communicator size and rank */
    uint32_t *members; /* [P]: worker rank of each communicator rank */
    uint32_t *owner;   /* [E]: worker rank owning expert e */
    uint32_t *owner_c; /* [E]: its communicator rank */
    pl_table *flat_c;  /* the same as a one-layer table over communicator ranks (dp_route) */
    uint8_t *owned;    /* [E] */
    tp_check check;
    mb_backend *be;
    tpc_comm *comm;
    sn_buf da, db, ha, hb;
};

/* Everything of one step about one peer (the own rank included). */
typedef struct sn_peer {
    /* what this rank sends it */
    int pairs_to, rows_to;
    size_t slots_at, rows_at; /* element offsets into the slot and row lists */
    tp_msg send;              /* shape */
    size_t send_bytes, send_pairs_at, send_off[TP_MAX_ARRAYS];
    uint8_t *d_send;       /* its block */
    uint8_t *h_send_pairs; /* the block's pair region, staged */
    uint16_t *d_crecv;     /* its COMBINE: bf16 [pairs_to, H] */
    /* what it sends this rank */
    tp_msg recv; /* validated shape */
    size_t recv_bytes, recv_pairs_at, recv_off[TP_MAX_ARRAYS];
    uint8_t *d_recv;
    uint8_t *h_recv_pairs;
    const uint32_t *pair_row, *pair_expert; /* host, within h_recv_pairs */
    const float *pair_w;
    uint16_t *d_cout; /* our COMBINE to it: bf16 [recv.n_pairs, H] */
} sn_peer;

typedef struct sn_ctx {
    sn_driver *d;
    mb_backend *be;
    sn_step *io;
    mb_step *step;
    void *stream;
    int P, H, k, SC, rank;
    sn_peer *peer;     /* [P] */
    uint32_t *h_slots; /* [sum pairs_to]: t*k + j, per destination in wire order */
    uint32_t *h_rows;  /* [sum rows_to]: token index, per destination ascending */
    uint32_t *d_slots, *d_rows;
    uint8_t *h_counts_out, *h_counts_in, *d_counts_out, *d_counts_in; /* [P * SN_COUNTS_SLOT] */
    float *d_qsf; /* e8m0 scales as f32, for the largest source */
    ep_err *err;  /* with the failure's code */
} sn_ctx;

/* ---- create and destroy ---------------------------------------------------------------------- */

static int sn_check_config(const sn_config *c, ep_err *err)
{
    if (c->world_size < 1 || c->world_size > EP_MAX_WORKERS || c->rank < 0 ||
        c->rank >= c->world_size || c->hidden <= 0 || c->hidden % EP_FP8_BLOCK != 0 ||
        c->hidden > MC_MAX_HIDDEN || c->topk < 1 || c->topk > MC_MAX_TOPK || c->n_experts < 1 ||
        c->n_experts > MC_MAX_EXPERTS)
        return ep_err_set(err, "nccl step: rank %d of %d, H %d, k %d, E %d out of range", c->rank,
                          c->world_size, c->hidden, c->topk, c->n_experts);
    for (int e = 0; e < c->n_experts; e++)
        if (c->expert_owner[e] >= (uint32_t)c->world_size)
            return ep_err_set(err, "nccl step: expert %d owned by rank %u of %d", e,
                              c->expert_owner[e], c->world_size);
    if (c->members == NULL)
        return 0;
    if (c->comm_size < 1 || c->comm_size > c->world_size || c->comm_rank < 0 ||
        c->comm_rank >= c->comm_size || c->members[c->comm_rank] != (uint32_t)c->rank)
        return ep_err_set(err, "nccl step: communicator rank %d of %d is not worker rank %d",
                          c->comm_rank, c->comm_size, c->rank);
    for (int i = 0; i < c->comm_size; i++)
        if (c->members[i] >= (uint32_t)c->world_size ||
            (i > 0 && c->members[i] <= c->members[i - 1]))
            return ep_err_set(err, "nccl step: members[%d] = %u, expected ascending ranks below %d",
                              i, c->members[i], c->world_size);
    return 0;
}

/* The communicator rank of worker rank r, or -1. */
static int sn_comm_of(const sn_driver *d, uint32_t r)
{
    for (int i = 0; i < d->P; i++)
        if (d->members[i] == r)
            return i;
    return -1;
}

/* Members (identity when none given) and each expert's communicator rank. */
static int sn_world(sn_driver *d, const sn_config *cfg, ep_err *err)
{
    d->P = cfg->members ? cfg->comm_size : cfg->world_size;
    d->me = cfg->members ? cfg->comm_rank : cfg->rank;
    d->members = malloc((size_t)d->P * sizeof *d->members);
    d->owner_c = malloc((size_t)cfg->n_experts * sizeof *d->owner_c);
    if (d->members == NULL || d->owner_c == NULL)
        return ep_err_set(err, "nccl step: out of memory");
    for (int i = 0; i < d->P; i++)
        d->members[i] = cfg->members ? cfg->members[i] : (uint32_t)i;
    for (int e = 0; e < cfg->n_experts; e++) {
        int c = sn_comm_of(d, d->owner[e]);
        if (c < 0)
            return ep_err_set(err,
                              "nccl step: expert %d is owned by rank %u, which is not in the "
                              "communicator",
                              e, d->owner[e]);
        d->owner_c[e] = (uint32_t)c;
    }
    d->flat_c = pl_flat(1, cfg->n_experts, d->P, d->owner_c, err);
    return d->flat_c ? 0 : -1;
}

sn_driver *sn_create(const sn_config *cfg, mb_backend *be, tpc_comm *comm, ep_err *err)
{
    if (be == NULL || comm == NULL) {
        ep_err_set(err, "nccl step: %s", be == NULL ? "no backend" : "no communicator");
        return NULL;
    }
    if (!mb_has_dev(be)) {
        ep_err_set(err, "nccl step: the %s backend has no device operations", mb_name(be));
        return NULL;
    }
    if (sn_check_config(cfg, err) != 0)
        return NULL;
    sn_driver *d = calloc(1, sizeof *d);
    size_t E = (size_t)cfg->n_experts;
    if (d == NULL || (d->owner = malloc(E * sizeof *d->owner)) == NULL ||
        (d->owned = malloc(E)) == NULL) {
        sn_destroy(&d);
        ep_err_set(err, "nccl step: out of memory");
        return NULL;
    }
    d->cfg = *cfg;
    memcpy(d->owner, cfg->expert_owner, E * sizeof *d->owner);
    d->cfg.expert_owner = d->owner;
    if (sn_world(d, cfg, err) != 0) {
        sn_destroy(&d);
        return NULL;
    }
    d->cfg.members = d->members;
    for (size_t e = 0; e < E; e++)
        d->owned[e] = d->owner[e] == (uint32_t)cfg->rank;
    d->check = (tp_check){.rank = cfg->rank,
                          .world_size = cfg->world_size,
                          .hidden = cfg->hidden,
                          .n_experts = cfg->n_experts,
                          .topk = cfg->topk,
                          .epoch = cfg->epoch,
                          .owned = d->owned,
                          .self_ok = true};
    d->be = be;
    d->comm = comm;
    return d;
}

void sn_destroy(sn_driver **self_p)
{
    sn_driver *d = *self_p;
    if (d == NULL)
        return;
    if (d->be) {
        mb_dev_free(d->be, d->da.p);
        mb_dev_free(d->be, d->db.p);
        mb_dev_free_host(d->be, d->ha.p);
        mb_dev_free_host(d->be, d->hb.p);
    }
    free(d->owner);
    free(d->owner_c);
    pl_free(&d->flat_c);
    free(d->members);
    free(d->owned);
    free(d);
    *self_p = NULL;
}

/* ---- helpers --------------------------------------------------------------------------------- */

static int sn_fail(sn_ctx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int sn_fail(sn_ctx *c, int code, const char *fmt, ...)
{
    EP_ERR_FROM_ARGS(c->err, (ep_err_code)code, fmt);
    return -1;
}

/* "rank 3 (b1)" for communicator rank i (worker rank and name). */
static const char *sn_name(const sn_ctx *c, int i, char *buf, size_t cap)
{
    int r = (int)c->d->members[i];
    if (c->d->cfg.peer_name && c->d->cfg.peer_name[r])
        snprintf(buf, cap, "rank %d (%s)", r, c->d->cfg.peer_name[r]);
    else
        snprintf(buf, cap, "rank %d", r);
    return buf;
}

/* A failed device operation of the step. */
static int sn_dev_fail(sn_ctx *c, const char *what)
{
    return sn_fail(c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "step %llu: %s: %s",
                   (unsigned long long)c->io->step_id, what, c->err->msg);
}

/* A failed exchange: the communicator says what kind of failure it was. */
static int sn_comm_fail(sn_ctx *c)
{
    tpc_fault f = tpc_last_fault(c->d->comm);
    int code = f == TPC_FAULT_DEADLINE    ? EPMOE__ERROR_CODE__ERR_TIMEOUT
               : f == TPC_FAULT_ABANDONED ? EPMOE__ERROR_CODE__ERR_STEP_FAILED
                                          : EPMOE__ERROR_CODE__ERR_COMM_FAILED;
    return sn_fail(c, code, "step %llu: %s", (unsigned long long)c->io->step_id, c->err->msg);
}

static size_t sn_round(size_t n)
{
    return (n + SN_ALIGN - 1) / SN_ALIGN * SN_ALIGN;
}

static size_t sn_take(size_t *at, size_t bytes)
{
    size_t off = *at;
    *at += sn_round(bytes);
    return off;
}

/* Make b hold need bytes (device or pinned host), replacing what it had. */
static int sn_reserve(sn_ctx *c, sn_buf *b, size_t need, bool host)
{
    if (need <= b->cap && b->p != NULL)
        return 0;
    sn_driver *d = c->d;
    size_t cap = need > 2 * b->cap ? need : 2 * b->cap;
    if (b->p)
        host ? mb_dev_free_host(d->be, b->p) : mb_dev_free(d->be, b->p);
    b->p = NULL;
    b->cap = 0;
    int rc = host ? mb_dev_alloc_host(d->be, &b->p, cap, c->err)
                  : mb_dev_alloc(d->be, &b->p, cap, c->err);
    if (rc != 0)
        return sn_dev_fail(c, host ? "pinned host workspace" : "device workspace");
    b->cap = cap;
    return 0;
}

static int sn_exchange(sn_ctx *c, const char *what, const tpc_xfer *s, int ns, const tpc_xfer *r,
                       int nr)
{
    if (tpc_exchange(c->d->comm, what, s, ns, r, nr, c->stream, c->io->deadline, c->io->idle,
                     c->io->idle_ctx, c->err) != 0)
        return sn_comm_fail(c);
    return 0;
}

/* Wait for the device's copies (to the host) before the host reads them. */
static int sn_wait(sn_ctx *c, const char *what)
{
    if (mb_dev_wait(c->be, c->io->deadline, c->err) != 0)
        return sn_dev_fail(c, what);
    return 0;
}

/* ---- planning (host) ------------------------------------------------------------------------- */

/* Each destination's pairs (slots t*k + j in token then slot order) and rows (distinct tokens,
 * ascending): the ZeroMQ plane's DISPATCH order, from the plan both planes share (plan.h) over
 * the communicator's ranks (one owner per expert: the NCCL plane's placement is flat). */
static int sn_plan(sn_ctx *c)
{
    int Tk = c->io->T * c->k;
    const int32_t *ids = c->io->topk_ids;
    for (int i = 0; i < Tk; i++)
        if (ids[i] >= c->d->cfg.n_experts)
            return sn_fail(c, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                           "step %llu: routing gave expert %d", (unsigned long long)c->io->step_id,
                           ids[i]);
    int *dest = malloc((size_t)Tk * sizeof *dest + 1);
    dp_plan plan = {0};
    ep_err err;
    if (dest == NULL || c->d->flat_c == NULL) {
        free(dest);
        return sn_fail(c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "step: out of memory");
    }
    dp_route(c->d->flat_c, 0, c->d->me, ids, NULL, Tk, NULL, dest, NULL);
    int rc = dp_group(&plan, c->P, c->k, NULL, dest, Tk, &err);
    free(dest);
    if (rc != 0)
        return sn_fail(c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "step: %s", err.msg);
    size_t n_slots = 0, n_rows = 0;
    for (int r = 0; r < c->P; r++) {
        n_slots += (size_t)plan.count[r];
        n_rows += (size_t)plan.rows[r];
    }
    c->h_slots = malloc(n_slots * sizeof *c->h_slots + 1);
    c->h_rows = malloc(n_rows * sizeof *c->h_rows + 1);
    if (c->h_slots == NULL || c->h_rows == NULL) {
        dp_plan_free(&plan);
        return sn_fail(c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "step: out of memory");
    }
    size_t slots_at = 0, rows_at = 0;
    for (int r = 0; r < c->P; r++) {
        sn_peer *p = &c->peer[r];
        p->pairs_to = plan.count[r];
        p->slots_at = slots_at;
        p->rows_at = rows_at;
        if (p->pairs_to)
            memcpy(c->h_slots + slots_at, plan.slot[r], (size_t)p->pairs_to * sizeof *c->h_slots);
        slots_at += (size_t)p->pairs_to;
        int last_t = -1;
        for (int j = 0; j < p->pairs_to; j++) {
            int t = (int)(c->h_slots[p->slots_at + (size_t)j] / (uint32_t)c->k);
            if (t != last_t)
                c->h_rows[rows_at + (size_t)p->rows_to++] = (uint32_t)t;
            last_t = t;
        }
        rows_at += (size_t)p->rows_to;
        p->send = (tp_msg){.kind = TP_DISPATCH,
                           .step_id = c->io->step_id,
                           .layer = c->io->layer_index,
                           .n_rows = p->rows_to,
                           .n_pairs = p->pairs_to,
                           .format = TP_FMT_FP8,
                           .scales_e8m0 = c->d->cfg.scales_e8m0};
        size_t len[TP_MAX_ARRAYS];
        tp_msg_layout(&p->send, c->H, p->send_off, len, &p->send_bytes);
        p->send_pairs_at = p->send_off[2];
    }
    dp_plan_free(&plan);
    return 0;
}

/* Carve workspace A (everything sized before the counts arrive). */
static int sn_carve_a(sn_ctx *c)
{
    size_t dat = 0, hat = 0, P = (size_t)c->P, slot_bytes = P * SN_COUNTS_SLOT;
    size_t n_slots = 0, n_rows = 0;
    for (int r = 0; r < c->P; r++) {
        n_slots += (size_t)c->peer[r].pairs_to;
        n_rows += (size_t)c->peer[r].rows_to;
    }
    size_t d_out = sn_take(&dat, slot_bytes), d_in = sn_take(&dat, slot_bytes);
    size_t d_slots = sn_take(&dat, n_slots * 4), d_rows = sn_take(&dat, n_rows * 4);
    size_t h_out = sn_take(&hat, slot_bytes), h_in = sn_take(&hat, slot_bytes);
    size_t *d_send = calloc(P, sizeof *d_send), *h_pairs = calloc(P, sizeof *h_pairs),
           *d_crecv = calloc(P, sizeof *d_crecv);
    if (d_send == NULL || h_pairs == NULL || d_crecv == NULL) {
        free(d_send);
        free(h_pairs);
        free(d_crecv);
        return sn_fail(c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "step: out of memory");
    }
    for (size_t r = 0; r < P; r++) {
        sn_peer *p = &c->peer[r];
        d_send[r] = sn_take(&dat, p->send_bytes);
        h_pairs[r] = sn_take(&hat, p->send_bytes - p->send_pairs_at);
        d_crecv[r] = sn_take(&dat, (size_t)p->pairs_to * (size_t)c->H * 2);
    }
    int rc = sn_reserve(c, &c->d->da, dat, false) || sn_reserve(c, &c->d->ha, hat, true) ? -1 : 0;
    if (rc == 0) {
        uint8_t *D = c->d->da.p, *Hh = c->d->ha.p;
        c->d_counts_out = D + d_out;
        c->d_counts_in = D + d_in;
        c->d_slots = (uint32_t *)(void *)(D + d_slots);
        c->d_rows = (uint32_t *)(void *)(D + d_rows);
        c->h_counts_out = Hh + h_out;
        c->h_counts_in = Hh + h_in;
        for (size_t r = 0; r < P; r++) {
            c->peer[r].d_send = D + d_send[r];
            c->peer[r].h_send_pairs = Hh + h_pairs[r];
            c->peer[r].d_crecv = (uint16_t *)(void *)(D + d_crecv[r]);
        }
    }
    free(d_send);
    free(h_pairs);
    free(d_crecv);
    return rc;
}

/* ---- counts ---------------------------------------------------------------------------------- */

static int sn_pack_counts(sn_ctx *c)
{
    for (int r = 0; r < c->P; r++) {
        const sn_peer *p = &c->peer[r];
        Epmoe__Dispatch m = EPMOE__DISPATCH__INIT;
        m.has_step_id = m.has_epoch = m.has_layer = m.has_src_rank = 1;
        m.has_n_rows = m.has_n_pairs = m.has_format = m.has_scales_e8m0 = 1;
        m.step_id = c->io->step_id;
        m.epoch = c->d->cfg.epoch;
        m.layer = c->io->layer_index;
        m.src_rank = (uint32_t)c->d->cfg.rank; /* worker ranks, as on the ZeroMQ plane */
        m.n_rows = (uint32_t)p->rows_to;
        m.n_pairs = (uint32_t)p->pairs_to;
        m.format = EPMOE__DISPATCH_FORMAT__DISPATCH_FP8;
        m.scales_e8m0 = p->send.scales_e8m0;
        uint8_t *slot = c->h_counts_out + (size_t)r * SN_COUNTS_SLOT;
        size_t n = epmoe__dispatch__get_packed_size(&m);
        if (n > SN_COUNTS_SLOT - 4) /* at most ~60 bytes: cannot happen */
            return sn_fail(c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "DISPATCH body of %zu bytes", n);
        memset(slot, 0, SN_COUNTS_SLOT);
        for (int b = 0; b < 4; b++)
            slot[b] = (uint8_t)(n >> (8 * b));
        epmoe__dispatch__pack(&m, slot + 4);
    }
    return 0;
}

/* Validate the counts from rank s: the ZeroMQ plane's checks, and that it is s's, for this
 * step and layer, in fp8. */
static int sn_parse_counts(sn_ctx *c, int s, ep_err *e)
{
    const uint8_t *slot = c->h_counts_in + (size_t)s * SN_COUNTS_SLOT;
    size_t n =
        (size_t)slot[0] | (size_t)slot[1] << 8 | (size_t)slot[2] << 16 | (size_t)slot[3] << 24;
    if (n > SN_COUNTS_SLOT - 4)
        return ep_err_set(e, "body length %zu, at most %d", n, SN_COUNTS_SLOT - 4);
    Epmoe__Dispatch *m = epmoe__dispatch__unpack(NULL, n, slot + 4);
    if (m == NULL)
        return ep_err_set(e, "body of %zu bytes is not a valid Dispatch message", n);
    sn_peer *p = &c->peer[s];
    int rc = tp_check_dispatch(&c->d->check, m, &p->recv, e);
    epmoe__dispatch__free_unpacked(m, NULL);
    if (rc != 0)
        return -1;
    if (p->recv.src_rank != (int)c->d->members[s])
        return ep_err_set(e, "src_rank %d, expected %u", p->recv.src_rank, c->d->members[s]);
    if (p->recv.step_id != c->io->step_id || p->recv.layer != c->io->layer_index)
        return ep_err_set(e, "step %llu layer %u, expected step %llu layer %u",
                          (unsigned long long)p->recv.step_id, p->recv.layer,
                          (unsigned long long)c->io->step_id, c->io->layer_index);
    if (p->recv.format != TP_FMT_FP8)
        return ep_err_set(e, "bf16 dispatch: the nccl plane carries fp8 only");
    size_t len[TP_MAX_ARRAYS];
    tp_msg_layout(&p->recv, c->H, p->recv_off, len, &p->recv_bytes);
    p->recv_pairs_at = p->recv_off[2];
    return 0;
}

static int sn_counts(sn_ctx *c)
{
    if (sn_pack_counts(c) != 0)
        return -1;
    size_t bytes = (size_t)c->P * SN_COUNTS_SLOT;
    if (mb_dev_h2d(c->be, c->d_counts_out, c->h_counts_out, bytes, c->err) != 0)
        return sn_dev_fail(c, "counts upload");
    tpc_xfer s[EP_MAX_WORKERS], r[EP_MAX_WORKERS];
    for (int p = 0; p < c->P; p++) {
        s[p] = (tpc_xfer){p, c->d_counts_out + (size_t)p * SN_COUNTS_SLOT, SN_COUNTS_SLOT};
        r[p] = (tpc_xfer){p, c->d_counts_in + (size_t)p * SN_COUNTS_SLOT, SN_COUNTS_SLOT};
    }
    if (sn_exchange(c, "dispatch counts", s, c->P, r, c->P) != 0)
        return -1;
    if (mb_dev_d2h(c->be, c->h_counts_in, c->d_counts_in, bytes, c->err) != 0)
        return sn_dev_fail(c, "counts download");
    if (sn_wait(c, "counts download") != 0)
        return -1;
    for (int s_ = 0; s_ < c->P; s_++) {
        ep_err e = {0};
        char who[EP_MAX_NAME + 32];
        if (sn_parse_counts(c, s_, &e) != 0)
            return sn_fail(
                c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "step %llu: DISPATCH counts from %s: %s",
                (unsigned long long)c->io->step_id, sn_name(c, s_, who, sizeof who), e.msg);
    }
    return 0;
}

/* Carve workspace B (sized by the counts received). */
static int sn_carve_b(sn_ctx *c)
{
    size_t dat = 0, hat = 0, P = (size_t)c->P, max_rows = 0;
    size_t *d_recv = calloc(P, sizeof *d_recv), *h_pairs = calloc(P, sizeof *h_pairs),
           *d_cout = calloc(P, sizeof *d_cout);
    if (d_recv == NULL || h_pairs == NULL || d_cout == NULL) {
        free(d_recv);
        free(h_pairs);
        free(d_cout);
        return sn_fail(c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "step: out of memory");
    }
    for (size_t r = 0; r < P; r++) {
        sn_peer *p = &c->peer[r];
        d_recv[r] = sn_take(&dat, p->recv_bytes);
        h_pairs[r] = sn_take(&hat, p->recv_bytes - p->recv_pairs_at);
        d_cout[r] = sn_take(&dat, (size_t)p->recv.n_pairs * (size_t)c->H * 2);
        if ((size_t)p->recv.n_rows > max_rows)
            max_rows = (size_t)p->recv.n_rows;
    }
    size_t qsf = sn_take(&dat, max_rows * (size_t)c->SC * sizeof(float));
    int rc = sn_reserve(c, &c->d->db, dat, false) || sn_reserve(c, &c->d->hb, hat, true) ? -1 : 0;
    if (rc == 0) {
        uint8_t *D = c->d->db.p, *Hh = c->d->hb.p;
        c->d_qsf = (float *)(void *)(D + qsf);
        for (size_t r = 0; r < P; r++) {
            sn_peer *p = &c->peer[r];
            p->d_recv = D + d_recv[r];
            p->h_recv_pairs = Hh + h_pairs[r];
            p->d_cout = (uint16_t *)(void *)(D + d_cout[r]);
            p->pair_row = (const uint32_t *)(const void *)p->h_recv_pairs;
            p->pair_expert =
                (const uint32_t *)(const void *)(p->h_recv_pairs + p->recv_off[3] - p->recv_off[2]);
            p->pair_w =
                (const float *)(const void *)(p->h_recv_pairs + p->recv_off[4] - p->recv_off[2]);
        }
    }
    free(d_recv);
    free(h_pairs);
    free(d_cout);
    return rc;
}

/* ---- dispatch -------------------------------------------------------------------------------- */

/* The pair region of destination r's block, on the host. */
static void sn_fill_pairs(sn_ctx *c, int r)
{
    sn_peer *p = &c->peer[r];
    uint8_t *base = p->h_send_pairs;
    uint32_t *row = (uint32_t *)(void *)base;
    uint32_t *ex = (uint32_t *)(void *)(base + p->send_off[3] - p->send_off[2]);
    float *w = (float *)(void *)(base + p->send_off[4] - p->send_off[2]);
    int k = -1, last_t = -1;
    for (int j = 0; j < p->pairs_to; j++) {
        uint32_t slot = c->h_slots[p->slots_at + (size_t)j];
        int t = (int)(slot / (uint32_t)c->k);
        if (t != last_t)
            k++;
        last_t = t;
        row[j] = (uint32_t)k;
        ex[j] = (uint32_t)c->io->topk_ids[slot];
        w[j] = c->io->topk_w[slot];
    }
}

/* Gather codes and scales into each block and upload the pairs, rows and slots. */
static int sn_fill_blocks(sn_ctx *c)
{
    size_t n_slots = 0, n_rows = 0;
    for (int r = 0; r < c->P; r++) {
        n_slots += (size_t)c->peer[r].pairs_to;
        n_rows += (size_t)c->peer[r].rows_to;
    }
    if ((n_rows && mb_dev_h2d(c->be, c->d_rows, c->h_rows, n_rows * 4, c->err) != 0) ||
        (n_slots && mb_dev_h2d(c->be, c->d_slots, c->h_slots, n_slots * 4, c->err) != 0))
        return sn_dev_fail(c, "row and slot upload");
    const uint8_t *q = mb_dev_step_q(c->step);
    const float *qs = mb_dev_step_qs(c->step);
    for (int r = 0; r < c->P; r++) {
        sn_peer *p = &c->peer[r];
        if (p->pairs_to == 0)
            continue;
        if (mb_dev_gather(c->be, c->H, p->rows_to, c->d_rows + p->rows_at, q, qs,
                          p->send.scales_e8m0, p->d_send + p->send_off[0],
                          p->d_send + p->send_off[1], c->err) != 0)
            return sn_dev_fail(c, "gather");
        sn_fill_pairs(c, r);
        if (mb_dev_h2d(c->be, p->d_send + p->send_pairs_at, p->h_send_pairs,
                       p->send_bytes - p->send_pairs_at, c->err) != 0)
            return sn_dev_fail(c, "pair upload");
    }
    return 0;
}

/* Send the blocks, receive the peers', bring their pairs to the host. */
static int sn_dispatch(sn_ctx *c)
{
    if (sn_fill_blocks(c) != 0)
        return -1;
    tpc_xfer s[EP_MAX_WORKERS], r[EP_MAX_WORKERS];
    int ns = 0, nr = 0;
    for (int i = 0; i < c->P; i++) {
        sn_peer *p = &c->peer[i];
        if (p->send_bytes) /* the peer computes the same 0 from our counts and posts nothing */
            s[ns++] = (tpc_xfer){i, p->d_send, p->send_bytes};
        if (p->recv_bytes)
            r[nr++] = (tpc_xfer){i, p->d_recv, p->recv_bytes};
    }
    if (sn_exchange(c, "dispatch", s, ns, r, nr) != 0)
        return -1;
    for (int i = 0; i < c->P; i++) {
        sn_peer *p = &c->peer[i];
        if (p->recv.n_pairs && mb_dev_d2h(c->be, p->h_recv_pairs, p->d_recv + p->recv_pairs_at,
                                          p->recv_bytes - p->recv_pairs_at, c->err) != 0)
            return sn_dev_fail(c, "pair download");
    }
    return sn_wait(c, "pair download");
}

/* The ZeroMQ plane's pair checks on every source's pairs, then the per-expert counts. */
static int sn_validate(sn_ctx *c)
{
    for (int s = 0; s < c->P; s++) {
        sn_peer *p = &c->peer[s];
        ep_err e = {0};
        char who[EP_MAX_NAME + 32];
        if (tp_check_pairs(&c->d->check, p->recv.n_rows, p->recv.n_pairs, p->pair_row,
                           p->pair_expert, &e) != 0)
            return sn_fail(c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "step %llu: DISPATCH from %s: %s",
                           (unsigned long long)c->io->step_id, sn_name(c, s, who, sizeof who),
                           e.msg);
    }
    for (int s = 0; s < c->P; s++)
        for (int j = 0; j < c->peer[s].recv.n_pairs; j++)
            c->io->expert_tokens[c->peer[s].pair_expert[j]]++;
    return 0;
}

/* ---- experts, combine, finish ---------------------------------------------------------------- */

static int sn_experts(sn_ctx *c)
{
    for (int s = 0; s < c->P; s++) {
        sn_peer *p = &c->peer[s];
        if (p->recv.n_pairs == 0)
            continue;
        const uint8_t *codes = p->d_recv + p->recv_off[0];
        const float *qs = (const float *)(const void *)(p->d_recv + p->recv_off[1]);
        if (p->recv.scales_e8m0) {
            size_t n = (size_t)p->recv.n_rows * (size_t)c->SC;
            if (mb_dev_scales_to_f32(c->be, n, p->d_recv + p->recv_off[1], c->d_qsf, c->err) != 0)
                return sn_dev_fail(c, "e8m0 scales");
            qs = c->d_qsf; /* reused per source: the stream orders the uses */
        }
        if (mb_dev_experts(c->be, c->io->layer, p->recv.n_rows, codes, qs, p->recv.n_pairs,
                           p->pair_row, p->pair_expert, p->pair_w, p->d_cout, c->err) != 0) {
            char who[EP_MAX_NAME + 32];
            char what[EP_MAX_NAME + 64];
            snprintf(what, sizeof what, "experts for %s", sn_name(c, s, who, sizeof who));
            return sn_dev_fail(c, what);
        }
    }
    return 0;
}

static int sn_combine(sn_ctx *c)
{
    tpc_xfer s[EP_MAX_WORKERS], r[EP_MAX_WORKERS];
    int ns = 0, nr = 0;
    size_t row = (size_t)c->H * 2;
    for (int i = 0; i < c->P; i++) {
        sn_peer *p = &c->peer[i];
        if (p->recv.n_pairs)
            s[ns++] = (tpc_xfer){i, p->d_cout, (size_t)p->recv.n_pairs * row};
        if (p->pairs_to)
            r[nr++] = (tpc_xfer){i, p->d_crecv, (size_t)p->pairs_to * row};
    }
    return sn_exchange(c, "combine", s, ns, r, nr);
}

static int sn_finish(sn_ctx *c)
{
    uint16_t *eo = mb_dev_step_eo(c->step, c->err);
    if (eo == NULL)
        return sn_dev_fail(c, "expert output buffer");
    for (int i = 0; i < c->P; i++) {
        sn_peer *p = &c->peer[i];
        if (p->pairs_to && mb_dev_scatter(c->be, c->H, p->pairs_to, c->d_slots + p->slots_at,
                                          p->d_crecv, eo, c->err) != 0)
            return sn_dev_fail(c, "scatter");
    }
    if (mb_dev_step_finish(c->step, c->io->out, c->io->deadline, c->err) != 0)
        return sn_dev_fail(c, "combine");
    for (int i = 0; i < c->P; i++) {
        if (i == c->rank)
            continue; /* what stays on the device is not data-plane traffic */
        c->io->dispatch_bytes += tp_msg_bytes(&c->peer[i].send, c->H);
        c->io->combine_bytes += (size_t)c->peer[i].recv.n_pairs * (size_t)c->H * 2;
    }
    return 0;
}

/* ---- the step -------------------------------------------------------------------------------- */

static int sn_begin(sn_ctx *c)
{
    sn_driver *d = c->d;
    tpc_comm *comm = d->comm;
    if (tpc_get_state(comm) != TPC_READY)
        return sn_fail(c, EPMOE__ERROR_CODE__ERR_COMM_FAILED,
                       "step %llu: the nccl communicator is %s%s%s",
                       (unsigned long long)c->io->step_id, tpc_state_name(tpc_get_state(comm)),
                       tpc_last_error(comm)[0] ? " after: " : "", tpc_last_error(comm));
    if (tpc_rank(comm) != c->rank || tpc_size(comm) != c->P)
        return sn_fail(c, EPMOE__ERROR_CODE__ERR_COMM_FAILED,
                       "step %llu: the communicator is rank %d of %d, the driver's rank %d of %d",
                       (unsigned long long)c->io->step_id, tpc_rank(comm), tpc_size(comm), c->rank,
                       c->P);
    c->stream = mb_dev_stream(d->be);
    c->step = mb_dev_step_begin(d->be, c->io->layer, c->io->T, c->io->x, c->io->ids,
                                c->io->topk_ids, c->io->topk_w, c->io->deadline, c->err);
    if (c->step == NULL)
        return sn_fail(c, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, "STEP %llu: %s",
                       (unsigned long long)c->io->step_id, c->err->msg);
    if (mb_step_shared(c->step, c->err) != 0)
        return sn_dev_fail(c, "shared expert");
    return 0;
}

int sn_run(sn_driver *d, sn_step *io, int *code, ep_err *err)
{
    sn_ctx c = {.d = d,
                .be = d->be,
                .io = io,
                .P = d->P,
                .H = d->cfg.hidden,
                .k = d->cfg.topk,
                .SC = d->cfg.hidden / EP_FP8_BLOCK,
                .rank = d->me,
                .err = err};
    io->dispatch_bytes = io->combine_bytes = 0;
    c.peer = calloc((size_t)c.P, sizeof *c.peer);
    int rc = c.peer == NULL ? sn_fail(&c, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory") : 0;
    if (rc == 0)
        rc = sn_begin(&c);
    if (rc == 0)
        rc = sn_plan(&c) || sn_carve_a(&c) || sn_counts(&c) || sn_carve_b(&c) || sn_dispatch(&c) ||
                     sn_validate(&c) || sn_experts(&c) || sn_combine(&c) || sn_finish(&c)
                 ? -1
                 : 0;
    /* a failed step cannot stay half-queued, and its peers wait on it: abort (the communicator
     * is rebuilt before the next step) */
    if (rc != 0 && tpc_get_state(d->comm) == TPC_READY)
        tpc_abort(d->comm, err->msg);
    mb_step_free(&c.step);
    free(c.peer);
    free(c.h_slots);
    free(c.h_rows);
    *code = rc == 0 ? EPMOE__ERROR_CODE__ERR_NONE : (int)wire_code(err);
    return rc;
}
