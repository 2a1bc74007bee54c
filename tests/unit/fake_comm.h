/*
 * fake_comm.h — a communicator library for unit tests (prefix fc_): the collective plane's
 * vtable (worker/transport_comm_lib.h tpc_ops) over threads of one process exchanging host memory.
 *
 * Semantics follow NCCL where the state machine depends on them: a communicator is ready only
 * once every rank of it has called init with the same id (or, for a shrink, every survivor has
 * called shrink with the same exclusions); a receive completes only when the peer's matching
 * send was posted (FIFO per source and destination, sizes must match); nothing ever completes
 * for a rank that does not take part, so a dead peer leaves its peers waiting, as on a GPU.
 * "Streams" are fc_stream objects the test creates per rank, or any other handle (what a CPU
 * backend's mb_dev_stream gives), which stands for a stream of its own; abort frees the handle
 * (so a use after abort is a use after free under ASan) and drops the receives it left pending.
 *
 * Injection: fc_fail_status makes a rank's communicators report an asynchronous error after a
 * number of polls; fc_aborts counts the aborts.
 */
#ifndef EPMOE_FAKE_COMM_H
#define EPMOE_FAKE_COMM_H

#include "worker/transport_comm_lib.h"

typedef struct fc_world fc_world;
typedef struct fc_stream fc_stream;

fc_world *fc_world_new(void);
void fc_world_free(fc_world **self_p);
/* The vtable; its ctx is the world. */
const tpc_ops *fc_ops(void);
/* A stream of the world (what tpc_exchange gets as stream). Freed with the world. */
fc_stream *fc_stream_new(fc_world *w);

/* From the next status poll on, after `after` more polls, every communicator of `rank` (its
 * rank inside that communicator) reports msg as its asynchronous error; rank -1: none. */
void fc_fail_status(fc_world *w, int rank, int after, const char *msg);
/* Aborts (and teardowns) so far, and communicators alive. */
int fc_aborts(fc_world *w);
int fc_live(fc_world *w);

#endif
