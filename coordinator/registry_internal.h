/*
 * registry_internal.h — what the files of the registry share (prefix reg_): the table of workers
 * (registry.c: the table, its queries and liveness), and the sending of WELCOME
 * (registry_send.c: what the coordinator tells workers), which registry_recv.c (what workers
 * tell the coordinator) answers with. Only coordinator/registry*.c include it.
 */
#ifndef EPMOE_REGISTRY_INTERNAL_H
#define EPMOE_REGISTRY_INTERNAL_H

#include <stdint.h>

#include "coordinator/registry.h"

struct reg_registry {
    int n;
    reg_worker *w; /* [n], index == rank */
    /* WELCOME's peer table, the same for every worker */
    Epmoe__Peer *peers;    /* [n] */
    Epmoe__Peer **peer_ps; /* [n] */
};

/* ---- registry_send.c ---- */

/* Queue a message for w at the routing id it registered from. */
void reg_send(ob_box *out, reg_worker *w, uint16_t type, const ProtobufCMessage *body);
/* WELCOME to w: the cluster's world, the model config and the placement of env->plan. */
void reg_send_welcome(reg_registry *r, const reg_env *env, reg_worker *w, ob_box *out);

#endif
