/*
 * serve_experts.h — the serving half of the serving path (prefix srv_, serve.h): the DISPATCHes
 * of every origin, this worker's own parts included, wait in one queue, and srv_serve runs each
 * layer's as one mb_experts call. serve.c (the origin half) feeds and runs it.
 */
#ifndef EPMOE_SERVE_EXPERTS_H
#define EPMOE_SERVE_EXPERTS_H

#include "worker/serve_state.h"

int srv_push_job(srv_server *s, srv_job j);
/* A peer's DISPATCH into the queue (d's storage taken). */
void srv_on_dispatch(srv_server *s, tp_msg *d);
/* Every queued job, one mb_experts call per layer; outputs to their requests and origins. */
void srv_serve(srv_server *s, const srv_env *env);

#endif
