/*
 * coord_reload.h — swapping a reloaded cluster spec into the running daemon (prefix coord_;
 * coord_reload.c; reload.h builds and validates what is swapped in).
 */
#ifndef EPMOE_COORD_RELOAD_H
#define EPMOE_COORD_RELOAD_H

#include <stddef.h>

#include "common/error.h"
#include "coordinator/coord_state.h"

/* Swap the validated reload in (no step is in flight). */
void coord_swap_reload(coord *c);
/* Build and validate; the swap follows once no step is in flight. 0, or -1 with err. */
int coord_reload(coord *c, char *summary, size_t cap, ep_err *err);

#endif
