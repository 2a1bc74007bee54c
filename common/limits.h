/*
 * limits.h — every hard bound of epmoe, named once, each with the reason it exists.
 *
 * Inputs from outside the process (files, YAML, JSON, network messages) are checked against
 * these before anything is multiplied or allocated (SQLite's sqliteLimit.h is the model).
 * Raising a limit is a deliberate change: the bounds keep size arithmetic far from overflow.
 */
#ifndef EPMOE_LIMITS_H
#define EPMOE_LIMITS_H

/* Length of a human-readable error message, including file, tensor and field names. */
#define EP_ERR_MSG_MAX 1024

/* Longest file path we accept anywhere (PATH_MAX on Linux). */
#define EP_MAX_PATH 4096

/* Longest tensor, worker, node or cluster name. Real checkpoint names are < 80 bytes. */
#define EP_MAX_NAME 256

/* safetensors: the reference reader rejects headers above 100 MB (spec §2.1). */
#define ST_MAX_HEADER_BYTES 100000000u

/* safetensors: tensors per file. DeepSeek V4 shards hold ~1-2e4; the bound keeps the name
 * table allocation small and refuses absurd headers early. */
#define ST_MAX_TENSORS 1000000

/* safetensors: dimensions per tensor. V4 uses at most 2; 8 leaves room for any sane model. */
#define ST_MAX_DIMS 8

/* Shard files listed by one model.safetensors.index.json. V4 Flash uses 46-48. */
#define ST_MAX_SHARDS 4096

/* config.json size: real configs are ~4 KiB; anything above 16 MiB is not a config. */
#define MC_MAX_CONFIG_BYTES (16u << 20)

/* Model dimensions accepted from config.json (V4 Flash: H 4096, I 2048, E 256, k 6). The bounds
 * keep every [T, H] and [E, ...] product inside 64-bit arithmetic with a wide margin. */
#define MC_MAX_HIDDEN  65536
#define MC_MAX_INTER   65536
#define MC_MAX_EXPERTS 4096
#define MC_MAX_TOPK    64
#define MC_MAX_LAYERS  1024
#define MC_MAX_MTP     16
#define MC_MAX_VOCAB   (1 << 24)

/* FP8 block size of every FP8 linear (spec §3.7) and activation quantization group (§5.2). */
#define EP_FP8_BLOCK 128
/* MXFP4 scale group along K (spec §3.6). */
#define EP_MXFP4_GROUP 32

/* YAML: nesting depth of a cluster spec (libyaml 0.2.5 has no limit of its own, and a deep
 * document would recurse in the loader). Real specs nest 4 levels. */
#define SPEC_MAX_DEPTH 32
/* YAML: cluster spec file size. */
#define SPEC_MAX_BYTES (4u << 20)
/* YAML: nodes (scalars, mappings, sequences) in a cluster spec. The loader keeps the document
 * as a tree before walking it; a spec for EP_MAX_WORKERS workers has ~12k nodes, and without
 * the bound 4 MiB of "[1,1,1,..." would cost ~2M nodes (~150 MB). */
#define SPEC_MAX_NODES 65536

/* Workers in one cluster; bounds the peer and placement tables in every message. */
#define EP_MAX_WORKERS 1024

/* ZeroMQ: largest control message body accepted before protobuf unpacking. Control messages
 * carry a config, a placement table and a peer table: well under 1 MiB at 1024 workers. */
#define EP_MAX_CTRL_MSG (4u << 20)
/* ZeroMQ: largest data-plane or forward-request payload (tokens x hidden x 4 bytes). */
#define EP_MAX_DATA_MSG (1u << 30)

/* Forward requests waiting behind the running step; more get ERR_BUSY instead of piling up
 * memory in the coordinator. */
#define EP_MAX_QUEUED_STEPS 64
/* Bytes those waiting requests may hold in all (their frames): 64 requests of EP_MAX_TOKENS
 * tokens would be 32 GiB at H = 4096. One request of the largest size (512 MiB at H = 4096)
 * always fits. */
#define EP_MAX_QUEUED_BYTES (1ull << 30)

/* Tokens in one forward request: bounds every [T, H] buffer a request can make us allocate. */
#define EP_MAX_TOKENS 65536

#endif
