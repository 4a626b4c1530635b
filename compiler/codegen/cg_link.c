/* cg_link.c - linking a program object with the runtime.  The MPI
 * compiler wrapper supplies OpenMPI's flags; the runtime archive and its
 * dependencies come from where this cleave was built (or
 * CLEAVE_RUNTIME_DIR). */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cg.h"

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

bool cg_link(const char *obj, const char *out, Diag *d) {
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
    pid_t pid;
    int rc = posix_spawnp(&pid, cc, NULL, NULL, argv, environ);
    if (rc != 0) return diag_error(d, DIAG_IO, "cannot run the linker '%s': %s", cc, strerror(rc));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return diag_error(d, DIAG_IO, "linking %s failed (%s %s %s ...)", out, cc, obj, rt);
    return true;
}
