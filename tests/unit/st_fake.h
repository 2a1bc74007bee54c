/*
 * st_fake.h — a stand-in for common/safetensors.c in test_checkpoint only.
 *
 * checkpoint.c needs st_dtype_name and st_model_find; safetensors.c is written in parallel on
 * another branch. st_fake.c defines those two functions (plus st_dtype_size) over an in-memory
 * table of st_tensor values, so test_checkpoint links without the real module. The definitions
 * are strong on purpose: if the real safetensors.o is ever pulled into the same link, the build
 * fails loudly instead of mixing the two. Once safetensors.c is merged, drop st_fake.{c,h} and
 * link test_checkpoint against the real library (ck_check_model can then run on files written
 * with st_writer).
 */
#ifndef EPMOE_TEST_ST_FAKE_H
#define EPMOE_TEST_ST_FAKE_H

#include "common/safetensors.h"

/* The fake model: a borrowed array of tensors, searched linearly. */
struct st_model {
    const st_tensor *tensors;
    int count;
};

#endif
