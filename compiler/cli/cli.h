/* cli.h - subcommands of the `cleave` executable.  Each returns the exit
 * status; only main() and these entry points decide exit codes. */
#ifndef CLEAVE_CLI_H
#define CLEAVE_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "../util/diag.h"

#define CLEAVE_VERSION "0.1.0"

int cmd_inspect(int argc, char **argv);
int cmd_ops(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_trace_stats(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);

/* Prints "cleave: error: <msg>" and returns the status for its code (1);
 * an internal error prints "cleave: internal error: <msg> (please report)"
 * and returns 70. */
int cli_fail(const Diag *d);
/* Usage error: "cleave <cmd>: <msg>" plus a hint; returns 2. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses a positive integer flag value; false on garbage or overflow. */
bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);

#endif
