/*
 * fuzz_safetensors.c — st_parse on arbitrary bytes.
 *
 * Whatever the input, st_parse must either refuse it with a message or return a file whose
 * every tensor lies inside the input and is found again by name. Touching each tensor's first
 * and last byte lets ASan catch a view that escapes the image; a lookup that misses or returns
 * another tensor, or a size that disagrees with shape x dtype, aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ep_err err;
    st_file *f = st_parse(data, size, "fuzz", &err);
    if (f == NULL) {
        if (err.msg[0] == '\0')
            abort(); /* every refusal says why */
        return 0;
    }
    volatile uint8_t sink = 0;
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        const uint8_t *p = t->data;
        if (p < data || t->nbytes > size || (size_t)(p - data) > size - t->nbytes)
            abort();
        if ((uint64_t)t->numel * st_dtype_size(t->dtype) != t->nbytes)
            abort();
        if (t->nbytes > 0)
            sink ^= p[0] ^ p[t->nbytes - 1];
        if (st_find(f, t->name) != t || t->file != f)
            abort();
        if (i > 0 && (const uint8_t *)st_at(f, i - 1)->data > p)
            abort(); /* st_at is in data order */
    }
    (void)sink;
    st_close(&f);
    return 0;
}
