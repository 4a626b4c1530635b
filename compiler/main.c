/* main.c - the `cleave` command: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char main_help[] =
    "usage: cleave <command> [options]\n"
    "\n"
    "cleave compiles ONNX models into partitioned training programs.\n"
    "\n"
    "commands:\n"
    "  inspect MODEL.onnx   shapes, parameters, FLOPs and unsupported ops of a model\n"
    "  compile MODEL.onnx   a training program for the model\n"
    "  plan MODEL.onnx      how to split training over N ranks, as the cost model sees it\n"
    "  ops                  the operators cleave supports\n"
    "  trace-stats FILE     busy, idle and bubble per rank from a program's --trace\n"
    "  report --plan P --trace T   a plan's prediction against a program's --trace\n"
    "  calibrate -o FILE    measure this machine into a cluster file for plan --cluster\n"
    "\n"
    "  cleave <command> --help   options of a command\n"
    "  cleave --version          version\n";

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(main_help, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(main_help, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("cleave %s\n", CLEAVE_VERSION);
        return 0;
    }
    if (strcmp(cmd, "inspect") == 0) return cmd_inspect(argc - 2, argv + 2);
    if (strcmp(cmd, "compile") == 0) return cmd_compile(argc - 2, argv + 2);
    if (strcmp(cmd, "plan") == 0) return cmd_plan(argc - 2, argv + 2);
    if (strcmp(cmd, "ops") == 0) return cmd_ops(argc - 2, argv + 2);
    if (strcmp(cmd, "trace-stats") == 0) return cmd_trace_stats(argc - 2, argv + 2);
    if (strcmp(cmd, "report") == 0) return cmd_report(argc - 2, argv + 2);
    if (strcmp(cmd, "calibrate") == 0) return cmd_calibrate(argc - 2, argv + 2);
    fprintf(stderr, "cleave: unknown command '%s' (see 'cleave --help')\n", cmd);
    return 2;
}
