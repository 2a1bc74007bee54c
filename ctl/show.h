/*
 * show.h — how epmoectl shows a resolved model config, in text and JSON (prefix show_).
 *
 * `inspect` (from config.json) and `config` (from the coordinator's broadcast) describe the same
 * mc_config; both print it through here so the two read the same and their JSON "config"
 * objects have one schema.
 */
#ifndef EPMOE_CTL_SHOW_H
#define EPMOE_CTL_SHOW_H

#include <jansson.h>

#include "common/model_config.h"

/* The shortest decimal that reads back as f, so JSON shows 1e-06, not 9.99999997e-07. */
double show_short_float(float f);

/* {"hidden_size", ..., "norm_topk_prob", "hash"}: every resolved field plus mc_hash in hex. */
json_t *show_config_json(const mc_config *c);

/* The expert_dtype, scales, sizes and layers lines of the text output (aligned at column 14). */
void show_config_text(const mc_config *c);

/* A command's one-line JSON report (-o json of forward, keygen): j compact on one line of
 * stdout, then released. NULL (json_pack failed) prints nothing. */
void show_json_line(json_t *j);

/* j as a YAML document on stdout (-o yaml of the admin verbs): the same tree as -o json, block
 * style, every string double-quoted (so no value changes type on reading: "no", "1.0", "null"
 * stay strings), reals always with a '.' (YAML 1.1 readers take 1e-06 for a string). */
void show_yaml(json_t *j);

#endif
