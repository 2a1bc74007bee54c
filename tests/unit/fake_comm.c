/*
 * fake_comm.c — see fake_comm.h. One mutex guards the whole world: tests are about ordering
 * and deadlines, not throughput.
 */
#include "fake_comm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FC_MAX_GROUPS  64
#define FC_MAX_STREAMS 64
#define FC_MAX_PENDING 256

typedef struct fc_msg {
    int src, dst;
    size_t bytes;
    uint8_t *data;
    struct fc_msg *next;
} fc_msg;

/* One library communicator across its ranks. */
typedef struct fc_group {
    uint8_t key[TPC_ID_BYTES + 8];
    int nranks, joined;
    fc_msg *head; /* sends not yet received, in posting order */
} fc_group;

struct tpc_handle {
    fc_world *w;
    fc_group *g;
    int rank;
};

typedef struct fc_recv {
    tpc_handle *h;
    int peer;
    void *ptr;
    size_t bytes;
} fc_recv;

struct fc_stream {
    fc_recv pending[FC_MAX_PENDING];
    int n_pending;
    const void *key; /* a foreign stream handle this one stands for, or NULL */
};

struct fc_world {
    pthread_mutex_t mu;
    fc_group groups[FC_MAX_GROUPS];
    int n_groups;
    fc_stream *streams[FC_MAX_STREAMS];
    int n_streams;
    int fail_rank, fail_after;
    char fail_msg[256];
    int aborts, live;
};

fc_world *fc_world_new(void)
{
    fc_world *w = calloc(1, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    w->fail_rank = -1;
    return w;
}

void fc_world_free(fc_world **self_p)
{
    fc_world *w = *self_p;
    if (w == NULL)
        return;
    for (int i = 0; i < w->n_groups; i++)
        for (fc_msg *m = w->groups[i].head, *n; m; m = n) {
            n = m->next;
            free(m->data);
            free(m);
        }
    for (int i = 0; i < w->n_streams; i++)
        free(w->streams[i]);
    pthread_mutex_destroy(&w->mu);
    free(w);
    *self_p = NULL;
}

/* The fc_stream of a stream handle: one of ours, or the stand-in for a foreign handle (a CPU
 * backend's mb_dev_stream: its operations are done when they return, so only the
 * communicator's receives are ever pending on it), made at its first use. Mutex held. */
static fc_stream *fc_stream_of(fc_world *w, void *stream)
{
    for (int i = 0; i < w->n_streams; i++)
        if (w->streams[i] == stream || w->streams[i]->key == stream)
            return w->streams[i];
    fc_stream *s = calloc(1, sizeof *s);
    if (s == NULL || w->n_streams == FC_MAX_STREAMS) {
        free(s);
        return NULL;
    }
    s->key = stream;
    w->streams[w->n_streams++] = s;
    return s;
}

fc_stream *fc_stream_new(fc_world *w)
{
    fc_stream *s = calloc(1, sizeof *s);
    pthread_mutex_lock(&w->mu);
    w->streams[w->n_streams++] = s;
    pthread_mutex_unlock(&w->mu);
    return s;
}

void fc_fail_status(fc_world *w, int rank, int after, const char *msg)
{
    pthread_mutex_lock(&w->mu);
    w->fail_rank = rank;
    w->fail_after = after;
    snprintf(w->fail_msg, sizeof w->fail_msg, "%s", msg);
    pthread_mutex_unlock(&w->mu);
}

int fc_aborts(fc_world *w)
{
    pthread_mutex_lock(&w->mu);
    int n = w->aborts;
    pthread_mutex_unlock(&w->mu);
    return n;
}

int fc_live(fc_world *w)
{
    pthread_mutex_lock(&w->mu);
    int n = w->live;
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* The group with this key, created on first use (mutex held). */
static fc_group *fc_group_of(fc_world *w, const uint8_t *key, int nranks)
{
    for (int i = 0; i < w->n_groups; i++)
        if (memcmp(w->groups[i].key, key, sizeof w->groups[i].key) == 0)
            return &w->groups[i];
    if (w->n_groups == FC_MAX_GROUPS)
        return NULL;
    fc_group *g = &w->groups[w->n_groups++];
    memcpy(g->key, key, sizeof g->key);
    g->nranks = nranks;
    return g;
}

static int fc_join(fc_world *w, const uint8_t *key, int nranks, int rank, tpc_handle **out,
                   ep_err *err)
{
    pthread_mutex_lock(&w->mu);
    fc_group *g = fc_group_of(w, key, nranks);
    if (g == NULL || g->nranks != nranks) {
        pthread_mutex_unlock(&w->mu);
        return ep_err_set(err, "fake: bad communicator (%d ranks)", nranks);
    }
    g->joined++;
    w->live++;
    pthread_mutex_unlock(&w->mu);
    tpc_handle *h = calloc(1, sizeof *h);
    *h = (tpc_handle){.w = w, .g = g, .rank = rank};
    *out = h;
    return 0;
}

static int fc_unique_id(void *ctx, tpc_id *id, ep_err *err)
{
    static unsigned counter;
    (void)ctx;
    (void)err;
    memset(id, 0, sizeof *id);
    unsigned n = __atomic_add_fetch(&counter, 1, __ATOMIC_SEQ_CST);
    snprintf((char *)id->bytes, sizeof id->bytes, "fake-id-%u", n);
    return 0;
}

static int fc_init(void *ctx, int nranks, const tpc_id *id, int rank, tpc_handle **out, ep_err *err)
{
    uint8_t key[TPC_ID_BYTES + 8] = {0};
    memcpy(key, id->bytes, TPC_ID_BYTES);
    return fc_join(ctx, key, nranks, rank, out, err);
}

static int fc_shrink(void *ctx, tpc_handle *h, const int *exclude, int n_exclude, tpc_handle **out,
                     ep_err *err)
{
    /* the child's key: the parent group's address and the excluded set (tests use < 255) */
    uint8_t key[TPC_ID_BYTES + 8] = {0};
    uintptr_t parent = (uintptr_t)h->g;
    memcpy(key, &parent, sizeof parent);
    int below = 0;
    for (int i = 0; i < n_exclude && 8 + i < TPC_ID_BYTES; i++) {
        key[8 + i] = (uint8_t)(exclude[i] + 1);
        below += exclude[i] < h->rank;
    }
    key[TPC_ID_BYTES] = 's';
    return fc_join(ctx, key, h->g->nranks - n_exclude, h->rank - below, out, err);
}

static int fc_status(tpc_handle *h, ep_err *err)
{
    fc_world *w = h->w;
    pthread_mutex_lock(&w->mu);
    int rc = h->g->joined < h->g->nranks ? 1 : 0;
    if (w->fail_rank == h->rank && w->fail_after-- <= 0) {
        ep_err_set(err, "%s", w->fail_msg);
        rc = -1;
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static int fc_exchange(tpc_handle *h, const tpc_xfer *sends, int n_sends, const tpc_xfer *recvs,
                       int n_recvs, void *stream, ep_err *err)
{
    fc_world *w = h->w;
    pthread_mutex_lock(&w->mu);
    fc_stream *s = fc_stream_of(w, stream);
    if (s == NULL || s->n_pending + n_recvs > FC_MAX_PENDING) {
        pthread_mutex_unlock(&w->mu);
        return ep_err_set(err, "fake: too many receives pending");
    }
    fc_msg **tail = &h->g->head;
    while (*tail)
        tail = &(*tail)->next;
    for (int i = 0; i < n_sends; i++) {
        if (sends[i].peer < 0 || sends[i].peer >= h->g->nranks) {
            pthread_mutex_unlock(&w->mu);
            return ep_err_set(err, "fake: send to rank %d of %d", sends[i].peer, h->g->nranks);
        }
        fc_msg *m = calloc(1, sizeof *m);
        *m = (fc_msg){.src = h->rank, .dst = sends[i].peer, .bytes = sends[i].bytes};
        m->data = malloc(sends[i].bytes + 1);
        memcpy(m->data, sends[i].ptr, sends[i].bytes);
        *tail = m;
        tail = &m->next;
    }
    for (int i = 0; i < n_recvs; i++)
        s->pending[s->n_pending++] =
            (fc_recv){.h = h, .peer = recvs[i].peer, .ptr = recvs[i].ptr, .bytes = recvs[i].bytes};
    pthread_mutex_unlock(&w->mu);
    return 0;
}

/* Match one pending receive (mutex held): 1 matched, 0 not yet, -1 size mismatch. */
static int fc_match(fc_recv *r, ep_err *err)
{
    fc_group *g = r->h->g;
    for (fc_msg **p = &g->head; *p; p = &(*p)->next) {
        fc_msg *m = *p;
        if (m->src != r->peer || m->dst != r->h->rank)
            continue;
        if (m->bytes != r->bytes)
            return ep_err_set(err, "fake: rank %d sent %zu bytes to rank %d, which expects %zu",
                              m->src, m->bytes, m->dst, r->bytes);
        memcpy(r->ptr, m->data, m->bytes);
        *p = m->next;
        free(m->data);
        free(m);
        return 1;
    }
    return 0;
}

static int fc_stream_query(void *ctx, void *stream, ep_err *err)
{
    fc_world *w = ctx;
    pthread_mutex_lock(&w->mu);
    fc_stream *s = fc_stream_of(w, stream);
    if (s == NULL) {
        pthread_mutex_unlock(&w->mu);
        return ep_err_set(err, "fake: too many streams");
    }
    int j = 0, rc = 0;
    for (int i = 0; i < s->n_pending; i++) {
        int m = rc < 0 ? 0 : fc_match(&s->pending[i], err);
        if (m < 0)
            rc = -1;
        if (m != 1)
            s->pending[j++] = s->pending[i];
    }
    s->n_pending = j;
    pthread_mutex_unlock(&w->mu);
    return rc < 0 ? -1 : j > 0;
}

static void fc_abort(tpc_handle *h)
{
    fc_world *w = h->w;
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n_streams; i++) {
        fc_stream *s = w->streams[i];
        int j = 0;
        for (int k = 0; k < s->n_pending; k++)
            if (s->pending[k].h != h)
                s->pending[j++] = s->pending[k];
        s->n_pending = j;
    }
    w->aborts++;
    w->live--;
    pthread_mutex_unlock(&w->mu);
    free(h);
}

static const tpc_ops fc_vtable = {.name = "fake",
                                  .unique_id = fc_unique_id,
                                  .init = fc_init,
                                  .shrink = fc_shrink,
                                  .status = fc_status,
                                  .exchange = fc_exchange,
                                  .stream_query = fc_stream_query,
                                  .abort = fc_abort};

const tpc_ops *fc_ops(void)
{
    return &fc_vtable;
}
