/*
 * spec_schema.h — the sections of a cluster spec and the checks of their values (prefix spec_;
 * the schema is docs/cluster-spec.md): one table of fields per mapping, each field naming its
 * handler, its destination and its range (spec_schema.c).
 */
#ifndef EPMOE_SPEC_SCHEMA_H
#define EPMOE_SPEC_SCHEMA_H

#include "coordinator/spec_yaml.h"

/* Walk the document (c->root) against the whole schema, filling c->s. 0, or -1 with c->err. */
int spec_walk_top(spec_ctx *c);

#endif
