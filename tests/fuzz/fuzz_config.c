/*
 * fuzz_config.c — mc_parse on arbitrary bytes (config.json is read from a checkpoint directory
 * an operator points at, so it is untrusted input).
 *
 * Beyond "no crash, no leak, no UB", every accepted config must satisfy the invariants the rest
 * of the system relies on: mc_validate accepts it, its canonical text fits the buffer mc_hash
 * uses, and hashing is deterministic. A violation aborts, which libFuzzer reports.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mc_config c;
    ep_err err;
    if (mc_parse((const char *)data, size, "fuzz.json", &c, &err) != 0) {
        if (err.msg[0] == '\0' || strlen(err.msg) >= sizeof err.msg)
            abort(); /* every failure explains itself */
        return 0;
    }
    if (mc_validate(&c, &err) != 0)
        abort();
    if (mc_canonical(&c, NULL, 0) >= 1024)
        abort();
    if (mc_hash(&c) != mc_hash(&c))
        abort();
    if (c.scale_e8m0 != (c.expert_dtype == MC_FP4))
        abort();
    return 0;
}
