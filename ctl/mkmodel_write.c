/*
 * mkmodel_write.c — writing a synthetic checkpoint (see mkmodel.h): the plan and its checks,
 * the output directory, the shards (each layer's items generated up to `threads` at once and
 * added to the shard's writer in table order), the index, and config.json last.
 */
#include "ctl/mkmodel.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "ctl/mkmodel_internal.h"

#define MK_INDEX_NAME  "model.safetensors.index.json"
#define MK_SINGLE_NAME "model.safetensors"
#define MK_CONFIG_NAME "config.json"

int mk_check(const mk_options *o, mk_plan *plan, ep_err *err)
{
    if (o->out_dir == NULL || o->out_dir[0] == '\0')
        return ep_err_set(err, "--out: an output directory is required");
    if (strlen(o->out_dir) > EP_MAX_PATH - 64)
        return ep_err_set(err, "--out: path longer than %d bytes", EP_MAX_PATH - 64);
    if (o->threads < 0)
        return ep_err_set(err, "--threads %d: expected 0 (one per CPU) or a positive count",
                          o->threads);
    mc_config c;
    if (mk_config(o, &c, err) != 0)
        return -1;
    const int n = mc_num_layers(&c);
    if (o->shards < 1 || o->shards > n || o->shards > ST_MAX_SHARDS)
        return ep_err_set(err,
                          "--shards %d: expected 1..%d (shards hold whole layers: %d main + %d "
                          "MTP)",
                          o->shards, n < ST_MAX_SHARDS ? n : ST_MAX_SHARDS, o->layers, o->mtp);
    /* Count without materialising: a layer's MoE table is 9 + 6E entries. */
    int64_t tensors = 0;
    for (int u = 0; u < n; u++)
        tensors += ck_layer_tensor_count(&c, u, 0, c.n_routed_experts);
    if (tensors > ST_MAX_TENSORS)
        return ep_err_set(err,
                          "the checkpoint would have more than %d tensors (ST_MAX_TENSORS, the "
                          "most an index may list): use fewer --experts or --layers",
                          ST_MAX_TENSORS);
    mk_plan p = {.shards = o->shards};
    mk_list l = {0};
    int rc = 0;
    for (int u = 0; rc == 0 && u < mk_unit_count(&c); u++) {
        l.count = 0;
        rc = mk_unit_items(&c, o->full, u, &l, err);
        for (int i = 0; rc == 0 && i < l.count; i++) {
            p.tensors += mk_item_tensors(&l.items[i]);
            p.bytes += mk_item_bytes(&l.items[i]);
        }
    }
    free(l.items);
    if (rc != 0)
        return -1;
    if (p.tensors > ST_MAX_TENSORS)
        return ep_err_set(err, "the checkpoint would have %d tensors, more than %d", p.tensors,
                          ST_MAX_TENSORS);
    if (plan != NULL)
        *plan = p;
    return 0;
}

/* ---- output directory ------------------------------------------------------------------- */

static int join(char *buf, size_t cap, const char *dir, const char *name, ep_err *err)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return ep_err_set(err, "%s/%s: path too long", dir, name);
    return 0;
}

/* Files a previous mkmodel (or any checkpoint) left that would mix with ours. */
static bool is_checkpoint_file(const char *name)
{
    const char *base[] = {MK_CONFIG_NAME, MK_INDEX_NAME};
    for (int i = 0; i < 2; i++) {
        size_t m = strlen(base[i]);
        if (strcmp(name, base[i]) == 0 ||
            (strncmp(name, base[i], m) == 0 && strcmp(name + m, ".tmp") == 0))
            return true;
    }
    return mk_has_suffix(name, ".safetensors") || mk_has_suffix(name, ".safetensors.tmp");
}

/* Create dir, or accept an empty one, or (force) clear its checkpoint files. */
static int prepare_dir(const char *dir, bool force, ep_err *err)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (errno != ENOENT)
            return ep_err_errno(err, "%s", dir);
        if (mkdir(dir, 0777) != 0)
            return ep_err_errno(err, "%s: cannot create the output directory", dir);
        return 0;
    }
    if (!S_ISDIR(sb.st_mode))
        return ep_err_set(err, "%s: exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (d == NULL)
        return ep_err_errno(err, "%s", dir);
    int rc = 0;
    bool empty = true;
    struct dirent *e;
    errno = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        empty = false;
        if (!force)
            break;
        if (!is_checkpoint_file(e->d_name))
            continue;
        char path[EP_MAX_PATH];
        rc = join(path, sizeof path, dir, e->d_name, err);
        if (rc == 0 && unlink(path) != 0)
            rc = ep_err_errno(err, "%s: cannot remove", path);
    }
    closedir(d);
    if (rc == 0 && !empty && !force)
        rc = ep_err_set(err,
                        "%s: directory is not empty; refusing to overwrite it (--force replaces "
                        "its config.json, index and *.safetensors)",
                        dir);
    return rc;
}

static int check_space(const char *dir, uint64_t need, ep_err *err)
{
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0)
        return 0; /* unknown: let the writes tell */
    uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
    if (avail < need)
        return ep_err_set(err,
                          "%s: the checkpoint needs %llu bytes but the file system has %llu "
                          "free",
                          dir, (unsigned long long)need, (unsigned long long)avail);
    return 0;
}

/* ---- config.json ------------------------------------------------------------------------ */

static int set_new(json_t *obj, const char *key, json_t *v)
{
    return v == NULL ? -1 : json_object_set_new(obj, key, v);
}

/* The attention fields of Flash (the MoE layer ignores them; present so readers skip them). */
static int set_flash_attention(json_t *root)
{
    int bad = set_new(root, "head_dim", json_integer(512));
    bad |= set_new(root, "q_lora_rank", json_integer(1024));
    bad |= set_new(root, "o_lora_rank", json_integer(1024));
    bad |= set_new(root, "o_groups", json_integer(8));
    bad |= set_new(root, "sliding_window", json_integer(128));
    return bad;
}

/* --full: the tiny attention the tensors have (MK_ATT_*), in the keys transformers reads. */
static int set_full_attention(json_t *root)
{
    int bad = set_new(root, "num_attention_heads", json_integer(MK_ATT_HEADS));
    bad |= set_new(root, "num_key_value_heads", json_integer(1));
    bad |= set_new(root, "head_dim", json_integer(MK_ATT_HEAD_DIM));
    bad |= set_new(root, "qk_rope_head_dim", json_integer(MK_ATT_ROPE_DIM));
    bad |= set_new(root, "q_lora_rank", json_integer(MK_ATT_Q_LORA));
    bad |= set_new(root, "o_lora_rank", json_integer(MK_ATT_O_LORA));
    bad |= set_new(root, "o_groups", json_integer(MK_ATT_OGROUPS));
    bad |= set_new(root, "index_n_heads", json_integer(MK_IDX_HEADS));
    bad |= set_new(root, "index_head_dim", json_integer(MK_IDX_HEAD_DIM));
    bad |= set_new(root, "index_topk", json_integer(MK_IDX_TOPK));
    bad |= set_new(root, "sliding_window", json_integer(MK_ATT_WINDOW));
    bad |= set_new(root, "rope_theta", json_real(10000.0));
    bad |= set_new(root, "compress_rope_theta", json_real(160000.0));
    bad |= set_new(root, "tie_word_embeddings", json_false());
    return bad;
}

static json_t *config_json(const mk_options *o, const mc_config *c)
{
    json_t *root = json_object(), *q = json_object(), *wbs = json_pack("[ii]", 128, 128),
           *cr = json_array(), *arch = json_pack("[s]", "DeepseekV4ForCausalLM"),
           *mlt = json_array();
    int bad = root == NULL || q == NULL || wbs == NULL || cr == NULL || arch == NULL || mlt == NULL;
    for (int i = 0; !bad && i < mc_num_layers(c); i++)
        /* Irrelevant to the MoE layer; the pattern of Flash (dense first layers, then
         * alternating compression ratios), one entry per layer incl. MTP. */
        bad |= json_array_append_new(cr, json_integer(mk_compress_ratio(i))) != 0;
    /* transformers' spelling of num_hash_layers (one entry per main layer); both are written,
     * equal, so readers of either agree. */
    for (int i = 0; !bad && i < c->num_hidden_layers; i++)
        bad |= json_array_append_new(mlt, json_string(mc_layer_is_hash(c, i) ? "hash_moe" : "moe"));
    if (bad) {
        json_decref(root), json_decref(q), json_decref(wbs), json_decref(cr), json_decref(arch);
        json_decref(mlt);
        return NULL;
    }
    bad |= set_new(root, "architectures", arch);
    bad |= set_new(root, "model_type", json_string("deepseek_v4"));
    bad |= set_new(root, "torch_dtype", json_string("bfloat16"));
    bad |= set_new(root, "hidden_size", json_integer(c->hidden_size));
    bad |= set_new(root, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
    bad |= set_new(root, "n_routed_experts", json_integer(c->n_routed_experts));
    bad |= set_new(root, "n_shared_experts", json_integer(c->n_shared_experts));
    bad |= set_new(root, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
    bad |= set_new(root, "norm_topk_prob", json_true());
    bad |= set_new(root, "routed_scaling_factor", json_real(MK_ROUTED_SCALING));
    bad |= set_new(root, "scoring_func", json_string("sqrtsoftplus"));
    bad |= set_new(root, "topk_method", json_string("noaux_tc"));
    bad |= set_new(root, "num_hash_layers", json_integer(c->num_hash_layers));
    bad |= set_new(root, "mlp_layer_types", mlt);
    bad |= set_new(root, "swiglu_limit", json_real(MK_SWIGLU_LIMIT));
    bad |= set_new(root, "hidden_act", json_string("silu"));
    bad |= set_new(root, "num_hidden_layers", json_integer(c->num_hidden_layers));
    bad |= set_new(root, "num_nextn_predict_layers", json_integer(c->num_nextn_predict_layers));
    bad |= set_new(root, "vocab_size", json_integer(c->vocab_size));
    bad |= set_new(root, "rms_norm_eps", json_real(MK_RMS_EPS));
    /* Top level (DeepSeek's, vLLM's) and in quantization_config (transformers'
     * FineGrainedFP8Config), equal. */
    if (!o->omit_expert_dtype) {
        bad |= set_new(root, "expert_dtype", json_string(mc_dtype_name(o->expert_dtype)));
        bad |= set_new(q, "expert_dtype", json_string(mc_dtype_name(o->expert_dtype)));
    }
    bad |= set_new(q, "quant_method", json_string("fp8"));
    bad |= set_new(q, "fmt", json_string("e4m3"));
    bad |= set_new(q, "scale_fmt", json_string("ue8m0"));
    bad |= set_new(q, "weight_block_size", wbs);
    bad |= set_new(q, "activation_scheme", json_string("dynamic"));
    bad |= set_new(root, "quantization_config", q);
    /* V4 fields the MoE layer ignores (spec §1.1), present so readers must skip them. */
    bad |= set_new(root, "hc_mult", json_integer(MK_HC_MULT));
    bad |= set_new(root, "hc_sinkhorn_iters", json_integer(20));
    bad |= set_new(root, "hc_eps", json_real(1e-6));
    bad |= set_new(root, "compress_ratios", cr);
    bad |= o->full ? set_full_attention(root) : set_flash_attention(root);
    bad |= set_new(root, "max_position_embeddings", json_integer(1048576));
    bad |= set_new(root, "bos_token_id", json_integer(0));
    bad |= set_new(root, "eos_token_id", json_integer(1));
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static int write_config(const mk_options *o, const mc_config *c, ep_err *err)
{
    char path[EP_MAX_PATH], tmp[EP_MAX_PATH];
    if (join(path, sizeof path, o->out_dir, MK_CONFIG_NAME, err) != 0 ||
        join(tmp, sizeof tmp, o->out_dir, MK_CONFIG_NAME ".tmp", err) != 0)
        return -1;
    json_t *root = config_json(o, c);
    if (root == NULL)
        return ep_err_set(err, "%s: out of memory", path);
    /* 15 significant digits print 1e-6 as 1e-06, not 9.9999999999999995e-07. */
    int rc = json_dump_file(root, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(root);
    if (rc != 0) {
        unlink(tmp);
        return ep_err_errno(err, "%s: write", tmp);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return ep_err_errno(err, "%s: rename to %s", tmp, path);
    }
    return 0;
}

/* ---- writing ---------------------------------------------------------------------------- */

typedef struct mk_index {
    char **names;
    const char **files;
    int count, cap;
} mk_index;

static int index_add(mk_index *ix, const char *name, const char *file, ep_err *err)
{
    if (ix->count == ix->cap) {
        int cap = ix->cap ? 2 * ix->cap : 256;
        char **nn = realloc(ix->names, (size_t)cap * sizeof *nn);
        if (nn == NULL)
            return ep_err_set(err, "out of memory for the index");
        ix->names = nn;
        const char **nf = realloc(ix->files, (size_t)cap * sizeof *nf);
        if (nf == NULL)
            return ep_err_set(err, "out of memory for the index");
        ix->files = nf;
        ix->cap = cap;
    }
    if ((ix->names[ix->count] = strdup(name)) == NULL)
        return ep_err_set(err, "out of memory for the index");
    ix->files[ix->count++] = file;
    return 0;
}

static void index_free(mk_index *ix)
{
    for (int i = 0; i < ix->count; i++)
        free(ix->names[i]);
    free(ix->names);
    free(ix->files);
}

/* Generate and write shard s; file is its name inside out_dir. Items are listed one unit at a
 * time, so the list stays one layer long. */
static int write_shard(const mk_options *o, const mc_config *c, int s, const char *file,
                       int threads, mk_index *ix, uint64_t *bytes, ep_err *err)
{
    mk_list l = {0};
    st_writer *w = st_writer_create();
    char path[EP_MAX_PATH];
    int rc = w == NULL ? ep_err_set(err, "out of memory") : 0;
    if (rc == 0)
        rc = join(path, sizeof path, o->out_dir, file, err);
    for (int u = 0; rc == 0 && u < mk_unit_count(c); u++) {
        if (mk_unit_shard(c, u, o->shards) != s)
            continue;
        l.count = 0;
        rc = mk_unit_items(c, o->full, u, &l, err);
        for (int i = 0; rc == 0 && i < l.count; i += threads) {
            int n = l.count - i < threads ? l.count - i : threads;
            rc = mk_gen_window(&l.items[i], n, o->seed, w, err);
        }
        for (int i = 0; rc == 0 && i < l.count; i++) {
            const mk_item *it = &l.items[i];
            rc = index_add(ix, it->name, file, err);
            if (rc == 0 && mk_item_tensors(it) == 2)
                rc = index_add(ix, it->scale_name, file, err);
        }
    }
    if (rc == 0)
        rc = st_writer_write(w, path, err);
    if (rc == 0)
        *bytes += st_writer_bytes(w);
    st_writer_destroy(&w);
    free(l.items);
    return rc;
}

int mk_write_model(const mk_options *o, ep_err *err)
{
    mk_plan plan;
    mc_config c;
    if (mk_check(o, &plan, err) != 0 || mk_config(o, &c, err) != 0)
        return -1;
    if (prepare_dir(o->out_dir, o->force, err) != 0 ||
        check_space(o->out_dir, plan.bytes, err) != 0)
        return -1;

    const int S = o->shards;
    const int threads = mk_threads(o);
    char(*files)[64] = calloc((size_t)S, sizeof *files);
    mk_index ix = {0};
    int rc = files == NULL ? ep_err_set(err, "out of memory") : 0;
    uint64_t total = 0;
    for (int s = 0; rc == 0 && s < S; s++) {
        if (S == 1)
            snprintf(files[s], sizeof files[s], "%s", MK_SINGLE_NAME);
        else
            snprintf(files[s], sizeof files[s], "model-%05d-of-%05d.safetensors", s + 1, S);
        rc = write_shard(o, &c, s, files[s], threads, &ix, &total, err);
    }
    if (rc == 0 && S > 1) {
        char path[EP_MAX_PATH];
        rc = join(path, sizeof path, o->out_dir, MK_INDEX_NAME, err);
        if (rc == 0)
            rc =
                st_index_write(path, ix.count, (const char *const *)ix.names, ix.files, total, err);
    }
    if (rc == 0)
        rc = write_config(o, &c, err);
    index_free(&ix);
    free(files);
    return rc;
}
