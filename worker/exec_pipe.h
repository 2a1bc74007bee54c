/*
 * exec_pipe.h — the executor's own messages on its pipe (exec.h says what each does), beside the
 * protocol's LOAD, STEP ... that the caller relays: both ends of the pipe speak them, the caller
 * (worker/control.c through exec.h) and the executor's files, which read the pipe also while a
 * step waits (exec_step.c).
 */
#ifndef EPMOE_EXEC_PIPE_H
#define EPMOE_EXEC_PIPE_H

/* Internal message types on the pipe, above every MsgType of epmoe.proto. */
enum {
    EXEC_CMD_SESSION = 1000,
    EXEC_CMD_RESET = 1001,
    EXEC_CMD_TERM = 1002,
    EXEC_CMD_METRICS = 1003,
    EXEC_EVT_RESET_DONE = 1100,
};

#endif
