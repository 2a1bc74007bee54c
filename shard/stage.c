/*
 * stage.c — the memory a load reads the checkpoint's tensors into (see shard.h, shard_stage).
 *
 * Why: a load reads every tensor of a layer into private memory before the backend packs it
 * (shard.h says why it reads rather than points into the mapping). With a malloc per tensor,
 * that memory was fresh on every layer: the kernel faulted it in 4 KiB pages and zeroed it,
 * once for the copies and once more for the packed weights, and a warm load ran at 0.2-0.3 of
 * a memcpy into fresh memory (issue 27). Here the copies are carved from a few large chunks in
 * transparent huge pages, and a stage serves the layers of a load one after another, so only
 * the first layer's copies touch fresh memory.
 */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "shard/shard.h"

#define STAGE_CHUNK                                                                                \
    ((size_t)256 << 20) /* a chunk holds many tensors; a larger one gets its own                   \
                         */
#define HUGE_PAGE  ((size_t)2 << 20)
#define MAX_CHUNKS 256

struct shard_stage {
    struct {
        uint8_t *base;
        size_t cap, used;
    } chunk[MAX_CHUNKS];
    int n;   /* chunks allocated */
    int cur; /* the chunk being filled */
};

shard_stage *shard_stage_create(void)
{
    return calloc(1, sizeof(shard_stage));
}

void shard_stage_free(shard_stage **self_p)
{
    if (!self_p || !*self_p)
        return;
    shard_stage *s = *self_p;
    for (int i = 0; i < s->n; i++)
        free(s->chunk[i].base);
    free(s);
    *self_p = NULL;
}

void shard_stage_reset(shard_stage *s)
{
    for (int i = 0; i < s->n; i++)
        s->chunk[i].used = 0;
    s->cur = 0;
}

static int chunk_add(shard_stage *s, size_t n)
{
    size_t cap = (n > STAGE_CHUNK ? n + HUGE_PAGE - 1 : STAGE_CHUNK) / HUGE_PAGE * HUGE_PAGE;
    void *p = NULL;
    if (s->n == MAX_CHUNKS || posix_memalign(&p, HUGE_PAGE, cap) != 0)
        return -1;
#ifdef MADV_HUGEPAGE
    madvise(p, cap, MADV_HUGEPAGE); /* a hint: failure changes nothing */
#endif
    s->chunk[s->n].base = p;
    s->chunk[s->n].cap = cap;
    s->chunk[s->n].used = 0;
    s->n++;
    return 0;
}

void *shard_stage_alloc(shard_stage *s, size_t n)
{
    n = (n + 63) / 64 * 64;
    n = n ? n : 64;
    /* the next chunk with room; a layer reads its tensors in the same order every time, so
     * the chunks of the last layer are taken again in turn */
    for (; s->cur < s->n; s->cur++)
        if (s->chunk[s->cur].cap - s->chunk[s->cur].used >= n)
            break;
    if (s->cur == s->n && chunk_add(s, n) < 0)
        return NULL;
    uint8_t *p = s->chunk[s->cur].base + s->chunk[s->cur].used;
    s->chunk[s->cur].used += n;
    return p;
}

size_t shard_stage_bytes(const shard_stage *s)
{
    size_t n = 0;
    for (int i = 0; i < s->n; i++)
        n += s->chunk[i].cap;
    return n;
}
