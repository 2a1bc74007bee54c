/*
 * spec_check.h — the rules that span fields of a cluster spec (prefix spec_), run over the
 * filled struct once every section has been read: unique names and endpoints, one worker per
 * GPU with NCCL, client endpoints, paths made relative to the spec file (spec_check.c).
 */
#ifndef EPMOE_SPEC_CHECK_H
#define EPMOE_SPEC_CHECK_H

#include "coordinator/spec_yaml.h"

/* The cross-field rules over c->s. 0, or -1 with c->err naming both fields' positions. */
int spec_cross_check(const spec_ctx *c);
/* The model path and, with security, the key paths, made relative to the spec file's directory. */
int spec_resolve_model(const spec_ctx *c);

#endif
