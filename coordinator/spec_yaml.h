/*
 * spec_yaml.h — reading a cluster spec's YAML (prefix spec_), shared by the spec files only:
 * the document tree that libyaml's events build (spec_yaml.c), the readers of its scalars, and
 * the walker that checks one mapping against a table of fields (spec_schema.c holds the tables,
 * one per section). Every error goes through spec_fail: FILE:LINE:COLUMN: what was expected.
 */
#ifndef EPMOE_SPEC_YAML_H
#define EPMOE_SPEC_YAML_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "coordinator/spec.h"

typedef enum ykind { YK_SCALAR, YK_MAP, YK_SEQ } ykind;

/* One YAML node. Children are linked by index (the array grows while loading); a mapping's
 * children alternate key, value. Scalars own a NUL-terminated copy of their text, which may
 * contain embedded NULs ("\0" escapes), hence len. */
typedef struct ynode {
    ykind kind;
    spec_pos pos;
    bool plain; /* scalar written without quotes: "~", "null" and "" then mean null */
    char *str;
    size_t len;
    int count;             /* children (a mapping has 2 per entry) */
    int first, last, next; /* child and sibling indices, -1 for none */
} ynode;

typedef struct spec_ctx {
    const char *file; /* for messages */
    const char *text;
    size_t len;
    const char *basedir; /* for relative model paths; "" keeps them relative */
    ep_err *err;
    ynode *nodes;
    int n_nodes, cap_nodes;
    int root; /* -1: the stream held no document */
    spec_cluster *s;
    int cap_workers;
    int cur_node; /* index of the node whose workers are being read */
} spec_ctx;

/* A section is the table of one mapping's keys; a field is one key: the handler that reads its
 * value into obj, whether it is required, where the value goes and in what range. */
typedef struct spec_field spec_field;
typedef int (*spec_handler)(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                            const char *path, void *obj);

typedef struct spec_section {
    const spec_field *fields;
    int n_fields;
} spec_section;

struct spec_field {
    const char *key;
    spec_handler handle;
    bool required;
    size_t off;       /* destination in obj */
    size_t cap;       /* string destinations: their size */
    long long lo, hi; /* integers: the allowed range */
    bool has_pos;     /* record the value's position at pos_off in obj */
    size_t pos_off;
    const spec_section *sub; /* nested mappings */
};

/* The most keys one section has; spec_walk tracks them in a fixed array. */
#define SPEC_MAX_FIELDS 12

/* A section over a field table, checked against spec_walk's fixed array. */
#define SPEC_SECTION(name, fields)                                                                 \
    _Static_assert(sizeof fields / sizeof fields[0] <= SPEC_MAX_FIELDS, #fields);                  \
    static const spec_section name = {fields, (int)(sizeof fields / sizeof fields[0])}

/* The error for pos, as FILE:LINE:COLUMN: message. Returns -1. */
int spec_fail(const spec_ctx *c, spec_pos pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Build the tree of c->text, enforcing SPEC_MAX_DEPTH and SPEC_MAX_NODES while loading and
 * refusing aliases, anchors and tags; c->root is the document (-1: none). 0, or -1 with c->err. */
int spec_tree_build(spec_ctx *c);

/* ---- scalars ---- */

const ynode *spec_node_at(const spec_ctx *c, int idx); /* NULL for -1 */
/* Text for messages: quoted, at most cap - 8 bytes of it, control bytes escaped, never a
 * UTF-8 sequence cut in half. */
const char *spec_quote(const char *s, size_t len, char *buf, size_t cap);
/* What a node is, for "found ..." in messages. */
const char *spec_found(const ynode *v, char *buf, size_t cap);
/* "path: expected <what>, found ...". Returns -1. */
int spec_type_error(const spec_ctx *c, const ynode *v, const char *path, const char *what);
/* The text of a non-empty string scalar without embedded NULs. what: "a name", "a path"... */
const char *spec_str(const spec_ctx *c, const ynode *v, const char *path, const char *what);
/* An integer scalar in [lo, hi]. 0, or -1 with the error. */
int spec_int(const spec_ctx *c, const ynode *v, const char *path, long long lo, long long hi,
             long long *out);

/* Walk one mapping against its section: every key known, none twice, every required one
 * present (reported at the mapping's own position). path names the mapping ("" = top). */
int spec_walk(spec_ctx *c, const ynode *map, const spec_section *sec, const char *path, void *obj);

#endif
