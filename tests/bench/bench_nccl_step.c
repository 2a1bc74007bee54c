/*
 * bench_nccl_step.c — the data movement of one MoE step on one GPU, over the two data planes,
 * for the same payload (issue 11, point 5; docs/performance.md).
 *
 *   bench_nccl_step [H [K]]      (defaults: V4-Flash's H 4096, k 6)
 *
 * Per step, T tokens all go to one peer (worst case for the wire): a DISPATCH block (fp8 codes
 * [T, H], e8m0 scales [T, H/128], pair_row/pair_expert/pair_weight [T*k]) and a COMBINE block
 * (bf16 [T*k, H]) back, laid out by tp_msg_layout.
 *
 *   nccl      the collective plane as the worker runs it (tpc_comm over NCCL, P = 1): the
 *             dispatch block sent to itself and received, then the combine block, each a grouped
 *             ncclSend/ncclRecv on the stream waited for by tpc_exchange.
 *   zmq+stage the ZeroMQ plane for GPU rows: device -> pinned host (cudaMemcpyAsync + sync) ->
 *             the message block -> tpz_send over tcp loopback -> tpz_pump/tpz_take on the other
 *             transport (validated) -> pinned -> device; then the combine block back the same
 *             way. Two transports (ranks 0 and 1) in this process, two ZeroMQ I/O threads as
 *             in the worker.
 *
 * Both start and end with the data in device memory. Reported: the median of per-step wall
 * times (at least 5 steps or 0.5 s per case, after 2 warm-up steps) and the ratio. Exit 77 when
 * there is no GPU.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/limits.h"
#include "worker/transport_comm.h"
#include "worker/transport_zmq.h"

#define E_BENCH 16

static int cuda_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 1;
    fprintf(stderr, "bench_nccl_step: %s: %s\n", what, cudaGetErrorString(e));
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_case {
    int T, H, k;
    tp_msg disp, comb; /* shapes */
    size_t disp_bytes, comb_bytes;
    void *d_disp, *d_disp_in, *d_comb, *d_comb_in;
    void *h_pin;
    cudaStream_t stream;
} bench_case;

/* A valid DISPATCH block (rank 1 owns every expert) on the device. */
static int case_init(bench_case *c, int T, int H, int k)
{
    *c = (bench_case){.T = T, .H = H, .k = k};
    c->disp = (tp_msg){.kind = TP_DISPATCH,
                       .step_id = 1,
                       .n_rows = T,
                       .n_pairs = T * k,
                       .format = TP_FMT_FP8,
                       .scales_e8m0 = true};
    c->comb = (tp_msg){.kind = TP_COMBINE, .step_id = 1, .n_pairs = T * k};
    size_t off[TP_MAX_ARRAYS], len[TP_MAX_ARRAYS];
    tp_msg_layout(&c->disp, H, off, len, &c->disp_bytes);
    tp_msg_layout(&c->comb, H, off, len, &c->comb_bytes);
    size_t big = c->disp_bytes > c->comb_bytes ? c->disp_bytes : c->comb_bytes;
    if (!cuda_ok(cudaMalloc(&c->d_disp, c->disp_bytes), "cudaMalloc") ||
        !cuda_ok(cudaMalloc(&c->d_disp_in, c->disp_bytes), "cudaMalloc") ||
        !cuda_ok(cudaMalloc(&c->d_comb, c->comb_bytes), "cudaMalloc") ||
        !cuda_ok(cudaMalloc(&c->d_comb_in, c->comb_bytes), "cudaMalloc") ||
        !cuda_ok(cudaMallocHost(&c->h_pin, big), "cudaMallocHost") ||
        !cuda_ok(cudaStreamCreate(&c->stream), "cudaStreamCreate"))
        return -1;
    uint8_t *blk = c->h_pin;
    memset(blk, 0x38, c->disp_bytes); /* codes 1.0, scales 2^-71: any bytes do */
    tp_msg m = c->disp;
    tp_msg_point(&m, H, blk);
    for (int p = 0; p < T * k; p++) {
        m.pair_row[p] = (uint32_t)(p / k);
        m.pair_expert[p] = (uint32_t)(p % E_BENCH);
        m.pair_weight[p] = 1.0f / (float)(1 + p % k);
    }
    if (!cuda_ok(cudaMemcpy(c->d_disp, blk, c->disp_bytes, cudaMemcpyHostToDevice), "H2D") ||
        !cuda_ok(cudaMemset(c->d_comb, 0x3F, c->comb_bytes), "cudaMemset"))
        return -1;
    return 0;
}

static void case_free(bench_case *c)
{
    cudaFree(c->d_disp);
    cudaFree(c->d_disp_in);
    cudaFree(c->d_comb);
    cudaFree(c->d_comb_in);
    cudaFreeHost(c->h_pin);
    if (c->stream)
        cudaStreamDestroy(c->stream);
}

/* ---- the NCCL plane ---------------------------------------------------------------------- */

static int nccl_step(tpc_comm *comm, bench_case *c, ep_err *err)
{
    int64_t deadline = clk_mono_ms() + 60000;
    tpc_xfer s = {0, c->d_disp, c->disp_bytes}, r = {0, c->d_disp_in, c->disp_bytes};
    if (tpc_exchange(comm, "dispatch", &s, 1, &r, 1, c->stream, deadline, NULL, NULL, err))
        return -1;
    s = (tpc_xfer){0, c->d_comb, c->comb_bytes};
    r = (tpc_xfer){0, c->d_comb_in, c->comb_bytes};
    return tpc_exchange(comm, "combine", &s, 1, &r, 1, c->stream, deadline, NULL, NULL, err);
}

/* ---- the ZeroMQ plane with host staging -------------------------------------------------- */

/* Device block -> pinned -> a message of shape `shape` -> tpz_send(src -> dst) -> received and
 * validated by dst -> pinned -> device. */
static int zmq_hop(tpz_transport *src, tpz_transport *dst, int dst_rank, const tp_msg *shape,
                   const void *d_from, void *d_to, size_t bytes, bench_case *c, ep_err *err)
{
    if (!cuda_ok(cudaMemcpyAsync(c->h_pin, d_from, bytes, cudaMemcpyDeviceToHost, c->stream),
                 "D2H") ||
        !cuda_ok(cudaStreamSynchronize(c->stream), "sync"))
        return ep_err_set(err, "D2H failed");
    tp_msg m = *shape;
    if (tpz_msg_alloc(&m, c->H, err) != 0)
        return -1;
    /* the message's block has the staging block's layout: copy it whole */
    memcpy(m.kind == TP_COMBINE ? (void *)m.out : (void *)m.codes, c->h_pin, bytes);
    if (tpz_send(src, dst_rank, &m, err) != 0)
        return -1;
    tp_msg got = {0};
    int64_t deadline = clk_mono_ms() + 60000;
    while (!tpz_take(dst, shape->step_id, &got)) {
        zmq_pollitem_t it = {.socket = tpz_socket(dst), .events = ZMQ_POLLIN};
        zmq_poll(&it, 1, 100);
        tpz_pump(dst);
        if (clk_mono_ms() > deadline)
            return ep_err_set(err, "no message after 60 s (last drop: %s)", tpz_last_drop(dst));
    }
    /* the received arrays are views into the frames: copy them into the staging block */
    size_t off[TP_MAX_ARRAYS], len[TP_MAX_ARRAYS], total;
    int n = tp_msg_layout(&got, c->H, off, len, &total);
    const void *src_arr[TP_MAX_ARRAYS] = {got.kind == TP_COMBINE ? (void *)got.out : got.codes,
                                          got.scales, got.pair_row, got.pair_expert,
                                          got.pair_weight};
    for (int i = 0; i < n; i++)
        memcpy((uint8_t *)c->h_pin + off[i], src_arr[i], len[i]);
    tpz_msg_release(&got);
    if (!cuda_ok(cudaMemcpyAsync(d_to, c->h_pin, bytes, cudaMemcpyHostToDevice, c->stream),
                 "H2D") ||
        !cuda_ok(cudaStreamSynchronize(c->stream), "sync"))
        return ep_err_set(err, "H2D failed");
    return 0;
}

static int zmq_step(tpz_transport *t0, tpz_transport *t1, bench_case *c, uint64_t step, ep_err *err)
{
    tp_msg d = c->disp, b = c->comb;
    d.step_id = b.step_id = step;
    if (zmq_hop(t0, t1, 1, &d, c->d_disp, c->d_disp_in, c->disp_bytes, c, err) != 0 ||
        zmq_hop(t1, t0, 0, &b, c->d_comb, c->d_comb_in, c->comb_bytes, c, err) != 0)
        return -1;
    tpz_finish(t0, step);
    tpz_finish(t1, step);
    return 0;
}

/* ---- driver -------------------------------------------------------------------------------- */

typedef int (*step_fn)(void *ctx, bench_case *c, uint64_t step, ep_err *err);

typedef struct planes {
    tpc_comm *comm;
    tpz_transport *t0, *t1;
} planes;

static int run_nccl(void *ctx, bench_case *c, uint64_t step, ep_err *err)
{
    (void)step;
    return nccl_step(((planes *)ctx)->comm, c, err);
}

static int run_zmq(void *ctx, bench_case *c, uint64_t step, ep_err *err)
{
    planes *p = ctx;
    return zmq_step(p->t0, p->t1, c, step, err);
}

/* Median seconds per step. */
static double measure(step_fn fn, void *ctx, bench_case *c, uint64_t *step, ep_err *err)
{
    double t[200];
    int n = 0;
    for (int w = 0; w < 2; w++)
        if (fn(ctx, c, ++*step, err) != 0)
            return -1;
    double start = clk_mono_s();
    while (n < 200 && (n < 5 || clk_mono_s() - start < 0.5)) {
        double t0 = clk_mono_s();
        if (fn(ctx, c, ++*step, err) != 0)
            return -1;
        t[n++] = clk_mono_s() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return t[n / 2];
}

static int open_planes(planes *p, void *zctx, int H, ep_err *err)
{
    tpc_id id;
    p->comm = tpc_create(tpc_nccl_ops(), NULL, err);
    if (p->comm == NULL || tpc_new_id(p->comm, &id, err) != 0 ||
        tpc_begin_init(p->comm, 1, 0, 0, 1, &id, err) != 0 ||
        tpc_wait_ready(p->comm, clk_mono_ms() + 60000, NULL, NULL, err) != 0)
        return -1;
    uint32_t owner[E_BENCH];
    for (int e = 0; e < E_BENCH; e++)
        owner[e] = 1;
    tpz_config cfg = {.rank = 0,
                      .world_size = 2,
                      .epoch = 1,
                      .hidden = H,
                      .n_experts = E_BENCH,
                      .expert_owner = owner,
                      .bind_endpoint = "tcp://127.0.0.1:*"};
    p->t0 = tpz_create(zctx, &cfg, err);
    cfg.rank = 1;
    p->t1 = p->t0 ? tpz_create(zctx, &cfg, err) : NULL;
    if (p->t1 == NULL)
        return -1;
    const char *eps[2] = {tpz_endpoint(p->t0), tpz_endpoint(p->t1)};
    return tpz_connect(p->t0, eps, err) == 0 && tpz_connect(p->t1, eps, err) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    int H = argc > 1 ? atoi(argv[1]) : 4096, k = argc > 2 ? atoi(argv[2]) : 6;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("bench_nccl_step: no GPU, skipped\n");
        return 77;
    }
    if (H <= 0 || H % EP_FP8_BLOCK != 0 || k < 1 || k > MC_MAX_TOPK) {
        fprintf(stderr, "usage: bench_nccl_step [H (multiple of 128) [k]]\n");
        return 64;
    }
    tpc_nccl_set_library(getenv("EPMOE_NCCL_LIBRARY")); /* as the worker's main does */
    cudaSetDevice(0);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    void *zctx = zmq_ctx_new();
    zmq_ctx_set(zctx, ZMQ_IO_THREADS, 2);
    ep_err err = {0};
    planes p = {0};
    int rc = 0;
    if (open_planes(&p, zctx, H, &err) != 0) {
        fprintf(stderr, "bench_nccl_step: %s\n", err.msg);
        rc = 1;
        goto done;
    }
    printf("bench_nccl_step: one step's dispatch + combine on %s (H %d, k %d, fp8 dispatch with "
           "e8m0 scales, bf16 combine; every token to one peer)\n",
           prop.name, H, k);
    printf("  %6s  %12s  %12s  %14s  %16s  %9s  %10s\n", "T", "dispatch B", "combine B",
           "nccl self us", "zmq+staging us", "zmq/nccl", "nccl GB/s");
    const int Ts[] = {16, 128, 512, 2048};
    uint64_t step = 0;
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0] && rc == 0; i++) {
        bench_case c;
        if (case_init(&c, Ts[i], H, k) != 0) {
            rc = 1;
            case_free(&c);
            break;
        }
        double tn = measure(run_nccl, &p, &c, &step, &err);
        double tz = tn < 0 ? -1 : measure(run_zmq, &p, &c, &step, &err);
        if (tn < 0 || tz < 0) {
            fprintf(stderr, "bench_nccl_step: T %d: %s\n", Ts[i], err.msg);
            rc = 1;
        } else {
            double bytes = (double)(c.disp_bytes + c.comb_bytes);
            printf("  %6d  %12zu  %12zu  %14.1f  %16.1f  %8.1fx  %10.1f\n", Ts[i], c.disp_bytes,
                   c.comb_bytes, tn * 1e6, tz * 1e6, tz / tn, bytes / tn / 1e9);
        }
        case_free(&c);
    }
done:
    tpz_destroy(&p.t0);
    tpz_destroy(&p.t1);
    tpc_destroy(&p.comm);
    zmq_ctx_term(zctx);
    return rc;
}
