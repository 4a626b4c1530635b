/* cg_link.c - linking a program object with the runtime.  The MPI
 * compiler wrapper supplies OpenMPI's flags; the runtime archive and its
 * dependencies come from where this cleave was built (or
 * CLEAVE_RUNTIME_DIR). */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cg.h"
#include "out_file.h"

extern char **environ;

#ifndef CLEAVE_RT_LIB
#define CLEAVE_RT_LIB "libcleave_rt.a"
#endif
#ifndef CLEAVE_PROTO_LIB
#define CLEAVE_PROTO_LIB "libonnx_proto.a"
#endif
#ifndef CLEAVE_RT_LINK_FLAGS
#define CLEAVE_RT_LINK_FLAGS ""
#endif

/* The linker's first message line, without its newline, into line: the
 * first one not from the collect2 driver, whose "ld returned 1 exit
 * status" says only that ld failed. */
static void first_error(const char *log_path, char *line, size_t len) {
    line[0] = 0;
    FILE *f = fopen(log_path, "r");
    if (!f) return;
    char buf[300];
    while (fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = 0;
        bool driver = strncmp(buf, "collect2", 8) == 0;
        if (!buf[0] || (driver && line[0])) continue;
        snprintf(line, len, "%s", buf);
        if (!driver) break;
    }
    fclose(f);
}

bool cg_link(const char *obj, const char *out, const char *shown, Diag *d) {
    char rt[4096], proto[4096];
    const char *dir = getenv("CLEAVE_RUNTIME_DIR");
    if (dir) {
        snprintf(rt, sizeof rt, "%s/libcleave_rt.a", dir);
        snprintf(proto, sizeof proto, "%s/libonnx_proto.a", dir);
    } else {
        snprintf(rt, sizeof rt, "%s", CLEAVE_RT_LIB);
        snprintf(proto, sizeof proto, "%s", CLEAVE_PROTO_LIB);
    }
    const char *cc = getenv("CLEAVE_MPICC") ? getenv("CLEAVE_MPICC") : "mpicc";
    char flags[256];
    snprintf(flags, sizeof flags, "%s", CLEAVE_RT_LINK_FLAGS);
    char *argv[32];
    int a = 0;
    argv[a++] = (char *)cc;
    argv[a++] = "-o";
    argv[a++] = (char *)out;
    argv[a++] = (char *)obj;
    argv[a++] = rt;
    argv[a++] = proto;
    for (char *tok = strtok(flags, " "); tok && a < 24; tok = strtok(NULL, " ")) argv[a++] = tok;
    argv[a++] = "-lprotobuf-c";
    argv[a++] = "-ljansson";
    argv[a++] = "-lz";
    argv[a++] = "-lm";
    argv[a++] = "-pthread"; /* the runtime's workers (rt_pool.c, --threads) */
    argv[a] = NULL;
    /* The linker's stdout and stderr go to a temporary beside the output. */
    OutFile log;
    int err = out_file_reserve(&log, shown);
    if (err) return diag_error(d, DIAG_IO, "-o %s: cannot write: %s", shown, out_file_why(err));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.tmp, O_WRONLY | O_TRUNC, 0);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid;
    int rc = posix_spawnp(&pid, cc, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        out_file_abort(&log);
        return diag_error(d, DIAG_IO, "cannot run the linker '%s': %s", cc, strerror(rc));
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) {
        char line[512];
        first_error(log.tmp, line, sizeof line);
        diag_error(d, DIAG_IO, "linking %s failed (%s ... %s): %s", shown, cc, rt, line[0] ? line : "no message");
    }
    out_file_abort(&log);
    return ok;
}
