/*
 * mathf_libm_diff.c — where the C library's expf/log1pf (what the layer called before
 * kernels/mathf.c) give other bits than mf_expf/mf_log1pf, on the inputs the layer feeds them
 * (docs/numerics.md §6):
 *   - SiLU's exp(-g): g is a bf16 value, so all 65536 are listed (input, old, new, MPFR);
 *   - the routing score sqrtf(softplus(l)) for every float logit l: the count, and the first
 *     LIMIT (default 20) listed with the C library's and MPFR's intermediate values.
 *
 *   mathf_libm_diff [LIMIT]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/formats.h"
#include "kernels/mathf.h"
#include "kernels/route.h"
#include "mathf_mpfr.h"

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float old_score(float l)
{
    return sqrtf(l > 20.0f ? l : log1pf(expf(l)));
}

int main(int argc, char **argv)
{
    long limit = argc > 1 ? atol(argv[1]) : 20;
    int silu = 0;
    printf("SiLU exp(-g), g bf16 (all 65536):\n");
    for (uint32_t h = 0; h < 65536; h++) {
        float x = -fmt_bf16_to_f32((uint16_t)h), o = expf(x), n = mf_expf(x);
        if (isnan(x) || bits_of(o) == bits_of(n))
            continue;
        silu++;
        printf("  g = %a (bf16 0x%04x): exp(%a) libm %a, mf %a, MPFR %a\n", (double)-x, h,
               (double)x, (double)o, (double)n, (double)mpfr_ref_expf(x));
    }
    printf("SiLU: %d of 65536 bf16 inputs differ\n", silu);
    uint64_t diff = 0;
    printf("routing score sqrtf(l > 20 ? l : log1p(exp(l))), every float l:\n");
    for (uint64_t i = 0; i < 1ull << 32; i++) {
        float l = f_of((uint32_t)i);
        if (isnan(l))
            continue;
        float o = old_score(l), n = route_score(l);
        if (bits_of(o) == bits_of(n))
            continue;
        if ((long)diff++ < limit) {
            float e = mpfr_ref_expf(l);
            printf("  l = %a: libm expf %a log1pf %a score %a | mf score %a | MPFR exp %a "
                   "log1p %a\n",
                   (double)l, (double)expf(l), (double)log1pf(expf(l)), (double)o, (double)n,
                   (double)e, (double)mpfr_ref_log1pf(e));
        }
    }
    printf("routing: %llu float logits give another score\n", (unsigned long long)diff);
    return 0;
}
