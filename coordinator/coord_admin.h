/*
 * coord_admin.h — what the admin verbs do to the running daemon (prefix coord_; coord_admin.c;
 * admin.h parses the requests and formats the replies).
 */
#ifndef EPMOE_COORD_ADMIN_H
#define EPMOE_COORD_ADMIN_H

#include "common/wire.h"
#include "coordinator/coord_state.h"

/* One admin request; takes ownership of m (heap). */
void coord_on_admin(coord *c, wire_msg *m);

#endif
