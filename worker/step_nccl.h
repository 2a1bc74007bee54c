/*
 * step_nccl.h — one MoE step over the collective (NCCL) data plane (prefix sn_).
 *
 * The executor's step when the session's data plane is nccl (docs/protocol.md "NCCL data
 * plane"). Every rank, including one alone (P = 1 sends to itself), runs the same sequence on
 * its device stream:
 *
 *   route + quantize own tokens (q/qs stay on the device)      mb_dev_step_begin, step_shared
 *   counts:   one DISPATCH body to every rank (a 128-byte slot: u32 LE length + the packed
 *             Epmoe__Dispatch), validated on receipt by tp_check_dispatch  tpc_exchange
 *   payloads: one block to every rank, laid out by tp_msg_layout exactly as the ZeroMQ plane's
 *             DISPATCH (fp8 codes, scales e8m0 or f32, pair_row, pair_expert, pair_weight);
 *             codes and scales gathered on the device, pairs planned on the host
 *   validate: the received pairs come to the host and pass tp_check_pairs
 *   experts:  on every source's rows, into that source's COMBINE block (bf16 [n_pairs, H])
 *   combine:  the blocks go back; each row is scattered to its [token, slot]; the shared
 *             expert and the combine finish on the device and the output comes to the host
 *
 * So the bits are those of the ZeroMQ plane (same rows, same pairs, same order, same kernels)
 * and of `forward --local`. Failure: any failed, late (io->deadline) or interrupted (io->idle)
 * part aborts the communicator (a half-done step cannot stay queued, and the peers are left
 * waiting on it anyway) and the step fails with a code: ERR_BAD_REQUEST (routing refused the
 * input), ERR_TIMEOUT (the deadline passed), ERR_COMM_FAILED (the library reported an error or
 * the communicator was not ready), ERR_STEP_FAILED (a peer's message failed validation, the
 * device failed, the owner abandoned the step). The coordinator rebuilds the communicator.
 *
 * The device is the worker's backend, through the seam's optional device operations
 * (kernels/moe_backend.h, mb_dev_*): the CUDA backend's device in the worker, the CPU backend's
 * host memory in the unit tests, which so run everything here on the CPU with its real math.
 * Owned by the executor thread.
 */
#ifndef EPMOE_STEP_NCCL_H
#define EPMOE_STEP_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/moe_backend.h"
#include "worker/transport.h"
#include "worker/transport_comm.h"

/* Bytes of one rank's counts message to another: a u32 length and the packed Dispatch. */
#define SN_COUNTS_SLOT 128

typedef struct sn_config {
    int rank, world_size; /* the session's (worker ranks): what DISPATCH bodies carry */
    /* The communicator's world: communicator rank i is worker rank members[i] (ascending; the
     * epoch's members); NULL members: the communicator is the session's world. */
    int comm_rank, comm_size;
    const uint32_t *members; /* [comm_size] (copied) */
    uint64_t epoch;
    int hidden, topk, n_experts;
    const uint32_t *expert_owner; /* [n_experts] (copied) */
    bool scales_e8m0;             /* the config's act_ue8m0: scales travel as e8m0 bytes */
    const char *const *peer_name; /* [world_size] for messages, or NULL */
} sn_config;

typedef struct sn_driver sn_driver;

/* The driver of one session: be and comm are borrowed (the executor owns them); be must have
 * device operations (mb_has_dev). */
sn_driver *sn_create(const sn_config *cfg, mb_backend *be, tpc_comm *comm, ep_err *err);
void sn_destroy(sn_driver **self_p);

/* One step's inputs and outputs (host memory). */
typedef struct sn_step {
    uint64_t step_id;
    const mb_layer *layer;
    uint32_t layer_index;
    int T;
    const uint16_t *x;       /* bf16 [T, H] */
    const int64_t *ids;      /* [T] or NULL */
    int32_t *topk_ids;       /* out [T, k] */
    float *topk_w;           /* out [T, k] */
    uint16_t *out;           /* out bf16 [T, H] */
    uint32_t *expert_tokens; /* [n_experts]: pairs computed per expert, added to */
    uint64_t dispatch_bytes; /* out: payload bytes sent to other ranks */
    uint64_t combine_bytes;
    int64_t deadline; /* clk_mono_ms */
    tpc_idle_fn idle; /* called while waiting; may be NULL */
    void *idle_ctx;
} sn_step;

/* Run a step: 0, or -1 with err and *code (an Epmoe__ErrorCode) set; the communicator is then
 * aborted. */
int sn_run(sn_driver *d, sn_step *io, int *code, ep_err *err);

#endif
