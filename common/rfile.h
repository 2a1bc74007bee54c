/*
 * rfile.h — opening input files that must be regular files (prefix rf_).
 *
 * A FIFO, a socket or a device where a config.json, an index, a cluster spec or a key file
 * should be would block open(2) (a FIFO waits for a writer) before any check could run. rf_open
 * opens with O_NONBLOCK, refuses anything but a regular file, then reads normally.
 */
#ifndef EPMOE_RFILE_H
#define EPMOE_RFILE_H

#include <stdio.h>

#include "common/error.h"

/* Open path for reading. Errors: "PATH: No such file or directory", "PATH: not a regular file".
 * what (may be NULL) names the file's role in messages ("cluster spec"). */
FILE *rf_open(const char *path, const char *what, ep_err *err);

#endif
