/*
 * spec.c — a loaded cluster spec's lookups and its destruction (see spec.h). Loading:
 * spec_load.c; the check against the model (spec_check_experts): spec_check.c.
 */
#include "coordinator/spec.h"

#include <stdlib.h>
#include <string.h>

void spec_free(spec_cluster **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    spec_cluster *s = *self_p;
    free(s->workers);
    free(s->nodes);
    free(s);
    *self_p = NULL;
}

const spec_worker *spec_find_worker(const spec_cluster *s, const char *name)
{
    for (int i = 0; s && name && i < s->n_workers; i++)
        if (strcmp(s->workers[i].name, name) == 0)
            return &s->workers[i];
    return NULL;
}
