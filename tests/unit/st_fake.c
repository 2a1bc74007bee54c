/* st_fake.c — see st_fake.h: the three safetensors functions checkpoint.c links against, over an
 * in-memory table. Test-only; remove when common/safetensors.c is merged. */
#include "st_fake.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} DTYPES[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},           [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},         [ST_U16] = {"U16", 2},         [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},       [ST_I32] = {"I32", 4},         [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},         [ST_F64] = {"F64", 8},         [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},         [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_F8_E8M0] = {"F8_E8M0", 1},
};

const char *st_dtype_name(st_dtype dt)
{
    return (unsigned)dt < ST_DTYPE_COUNT ? DTYPES[dt].name : "?";
}

size_t st_dtype_size(st_dtype dt)
{
    return (unsigned)dt < ST_DTYPE_COUNT ? DTYPES[dt].size : 0;
}

const st_tensor *st_model_find(const st_model *m, const char *name)
{
    for (int i = 0; i < m->count; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return &m->tensors[i];
    return NULL;
}
