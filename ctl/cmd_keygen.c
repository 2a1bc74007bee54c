/*
 * cmd_keygen.c — `epmoectl keygen --out DIR --name NAME`: a CURVE key pair for a cluster spec
 * with a security: section (common/auth.h, docs/operations.md "Security").
 *
 * Writes DIR/NAME.key (secret and public key, mode 0600: give it to NAME only) and DIR/NAME.pub
 * (the public key: put it in the spec's worker_keys or operator_keys directory, or hand the
 * coordinator's to workers and operators). Existing files are never overwritten. Exit codes: 0
 * written; 64 usage (NAME not a plain file name); 70 this libzmq has no CURVE; 73 a file cannot
 * be created (DIR missing, the key exists).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/auth.h"
#include "ctl/cmds.h"
#include "ctl/show.h"

static void keygen_usage(FILE *f)
{
    fprintf(f, "usage: epmoectl keygen --out DIR --name NAME\n\n"
               "Write DIR/NAME.key (secret, mode 0600) and DIR/NAME.pub (public) with a fresh\n"
               "CURVE key pair. Existing files are never overwritten.\n\n"
               "exit codes: 0 written, 64 usage, 70 no CURVE in this libzmq, 73 cannot create\n");
}

static void keygen_report(const cmd_ctx *ctx, const char *dir, const char *name)
{
    char path[EP_MAX_PATH + EP_MAX_NAME + 8], z85[AUTH_Z85_LEN + 1] = "";
    uint8_t pub[AUTH_KEY_BYTES];
    ep_err err;
    snprintf(path, sizeof path, "%s/%s.pub", dir, name);
    if (auth_load_public(path, pub, &err) == 0)
        auth_z85(pub, z85);
    if (ctx->output == CMD_OUT_JSON) {
        char key[sizeof path];
        snprintf(key, sizeof key, "%s/%s.key", dir, name);
        json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:s}", "schema", 1, "name", name, "key", key,
                              "pub", path, "public_key", z85);
        show_json_line(j);
        return;
    }
    printf("keygen: wrote %s/%s.key (secret, mode 0600) and %s (public key %s)\n", dir, name, path,
           z85);
}

int cmd_keygen(const cmd_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL, *name = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            keygen_usage(stdout);
            return CMD_OK;
        }
        const char **slot = strcmp(argv[i], "--out") == 0    ? &dir
                            : strcmp(argv[i], "--name") == 0 ? &name
                                                             : NULL;
        if (slot == NULL || i + 1 >= argc) {
            fprintf(stderr, "epmoectl keygen: %s %s (see epmoectl keygen --help)\n", argv[i],
                    slot ? "needs a value" : "is not an option");
            return CMD_USAGE;
        }
        *slot = argv[++i];
    }
    if (dir == NULL || name == NULL) {
        keygen_usage(stderr);
        return CMD_USAGE;
    }
    if (name[0] == '\0' || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
        strlen(name) >= EP_MAX_NAME) {
        fprintf(stderr, "epmoectl keygen: --name \"%.64s\": expected a file name without '/'\n",
                name);
        return CMD_USAGE;
    }
    if (!auth_available()) {
        fprintf(stderr, "epmoectl keygen: this libzmq has no CURVE support\n");
        return CMD_SOFTWARE;
    }
    ep_err err = {0};
    if (auth_keygen(dir, name, &err) != 0) {
        fprintf(stderr, "epmoectl keygen: %s\n", err.msg);
        return CMD_CANTCREAT;
    }
    keygen_report(ctx, dir, name);
    return CMD_OK;
}
