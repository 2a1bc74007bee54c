/* keys.c — see keys.h. */
#include "coordinator/keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

static int keys_fail(const spec_cluster *s, spec_pos pos, const char *key, ep_err *err)
{
    return ep_err_prefix(err, "%s:%d:%d: security.%s", s->file, pos.line, pos.col, key);
}

static int keys_load_workers(const spec_cluster *s, keys_cluster *k, ep_err *err)
{
    k->worker = calloc((size_t)s->n_workers, sizeof *k->worker);
    if (k->worker == NULL)
        return ep_err_set(err, "out of memory");
    k->n_workers = s->n_workers;
    for (int r = 0; r < s->n_workers; r++) {
        char path[EP_MAX_PATH + EP_MAX_NAME + 8];
        snprintf(path, sizeof path, "%s/%s.pub", s->worker_keys, s->workers[r].name);
        if (auth_load_public(path, k->worker[r], err) != 0) {
            ep_err_prefix(err, "worker %s needs its public key (epmoectl keygen --name %s)",
                          s->workers[r].name, s->workers[r].name);
            return keys_fail(s, s->worker_keys_pos, "worker_keys", err);
        }
    }
    return 0;
}

/* A key speaks for one name: a client key that is a worker's would let a client register as
 * that worker, one that is an operator's would give a client the admin verbs. */
static int keys_check_client(const spec_cluster *s, const keys_cluster *k, ep_err *err)
{
    for (int r = 0; r < k->n_workers; r++) {
        const char *name = auth_list_find(k->clients, k->worker[r]);
        if (name != NULL) {
            ep_err_set(err,
                       "client key %s.pub is worker %s's key (%s/%s.pub); a client needs a "
                       "key of its own",
                       name, s->workers[r].name, s->worker_keys, s->workers[r].name);
            return keys_fail(s, s->client_keys_pos, "client_keys", err);
        }
    }
    auth_list *both = auth_list_new();
    if (both == NULL)
        return ep_err_set(err, "out of memory");
    int rc = auth_list_merge(both, k->operators, err) != 0 ||
                     auth_list_merge_as(both, k->clients, KEYS_CLIENT_PREFIX, err) != 0
                 ? keys_fail(s, s->client_keys_pos, "client_keys", err)
                 : 0;
    auth_list_free(&both);
    return rc;
}

static int keys_load_clients(const spec_cluster *s, keys_cluster *k, ep_err *err)
{
    if ((k->clients = auth_list_new()) == NULL)
        return ep_err_set(err, "out of memory");
    if (!s->client_keys[0])
        return 0;
    if (auth_list_add_dir(k->clients, s->client_keys, err) != 0)
        return keys_fail(s, s->client_keys_pos, "client_keys", err);
    if (auth_list_count(k->clients) == 0)
        log_warn("%s: security.client_keys %s holds no *.pub: no client can use the cluster",
                 s->file, s->client_keys);
    return keys_check_client(s, k, err);
}

/* The keys workers admit on their client endpoints, for WELCOME: the clients, and the
 * operators only when the spec names no client_keys (then epmoectl forward with an operator's
 * key is the only client there is); with client_keys an operator is no client. */
static int keys_serving(const spec_cluster *s, keys_cluster *k, ep_err *err)
{
    int nc = auth_list_count(k->clients);
    int no = s->client_keys[0] ? 0 : auth_list_count(k->operators);
    k->serving = calloc((size_t)(nc + no) + 1, sizeof *k->serving);
    if (k->serving == NULL)
        return ep_err_set(err, "out of memory");
    for (int i = 0; i < nc + no; i++) {
        const uint8_t *key =
            i < nc ? auth_list_key(k->clients, i) : auth_list_key(k->operators, i - nc);
        k->serving[i].len = AUTH_KEY_BYTES;
        k->serving[i].data = (uint8_t *)key;
    }
    k->n_serving = nc + no;
    return 0;
}

int keys_load(const spec_cluster *s, keys_cluster *k, ep_err *err)
{
    memset(k, 0, sizeof *k);
    if (!auth_available())
        return ep_err_set(err, "%s:%d:%d: security: this libzmq has no CURVE support", s->file,
                          s->security_pos.line, s->security_pos.col);
    if (auth_load_secret(s->coordinator_key, &k->coordinator, err) != 0) {
        keys_fail(s, s->coordinator_key_pos, "coordinator_key", err);
        goto fail;
    }
    if (keys_load_workers(s, k, err) != 0)
        goto fail;
    if ((k->operators = auth_list_new()) == NULL) {
        ep_err_set(err, "out of memory");
        goto fail;
    }
    if (auth_list_add_dir(k->operators, s->operator_keys, err) != 0) {
        keys_fail(s, s->operator_keys_pos, "operator_keys", err);
        goto fail;
    }
    if (auth_list_count(k->operators) == 0)
        log_warn("%s: security.operator_keys %s holds no *.pub: no operator can use epmoectl",
                 s->file, s->operator_keys);
    if (keys_load_clients(s, k, err) != 0 || keys_serving(s, k, err) != 0)
        goto fail;
    return 0;
fail:
    keys_free(k);
    return -1;
}

void keys_free(keys_cluster *k)
{
    explicit_bzero(&k->coordinator, sizeof k->coordinator);
    free(k->worker);
    k->worker = NULL;
    k->n_workers = 0;
    auth_list_free(&k->operators);
    auth_list_free(&k->clients);
    free(k->serving);
    k->serving = NULL;
    k->n_serving = 0;
}

auth_list *keys_worker_list(const spec_cluster *s, const keys_cluster *k, ep_err *err)
{
    auth_list *l = auth_list_new();
    if (l == NULL) {
        ep_err_set(err, "out of memory");
        return NULL;
    }
    for (int r = 0; r < s->n_workers && r < k->n_workers; r++)
        if (auth_list_add(l, k->worker[r], s->workers[r].name, err) != 0) {
            auth_list_free(&l);
            keys_fail(s, s->worker_keys_pos, "worker_keys", err);
            return NULL;
        }
    return l;
}

auth_list *keys_operator_list(const keys_cluster *k, ep_err *err)
{
    auth_list *l = auth_list_new();
    if (l == NULL) {
        ep_err_set(err, "out of memory");
        return NULL;
    }
    if (auth_list_merge(l, k->operators, err) != 0 ||
        (k->clients && auth_list_merge_as(l, k->clients, KEYS_CLIENT_PREFIX, err) != 0))
        auth_list_free(&l);
    return l;
}

bool keys_is_client(const char *user_id)
{
    return user_id != NULL &&
           strncmp(user_id, KEYS_CLIENT_PREFIX, sizeof KEYS_CLIENT_PREFIX - 1) == 0;
}
