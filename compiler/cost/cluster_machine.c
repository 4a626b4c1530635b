/* cluster_machine.c - the cluster cleave assumes when no file is given:
 * this machine's calibration when `cleave calibrate --cache` has stored
 * one, else the stated defaults (cluster.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"

bool cluster_cache_path(char *buf, size_t len) {
    const char *env = getenv("CLEAVE_CLUSTER_CACHE");
    if (env && *env) return (size_t)snprintf(buf, len, "%s", env) < len;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) return (size_t)snprintf(buf, len, "%s/cleave/cluster.json", xdg) < len;
    if (home && *home) return (size_t)snprintf(buf, len, "%s/.cache/cleave/cluster.json", home) < len;
    return false;
}

/* The cores this process may run on: ranks beyond them time-share. */
static int machine_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 && n <= CLUSTER_MAX_RANKS ? (int)n : 0;
}

/* ", sharing its C cores" when the ranks outnumber this machine's cores. */
static void sharing(const Cluster *c, int ranks, char *buf, size_t len) {
    if (c->cores_per_node > 0 && ranks > c->cores_per_node)
        snprintf(buf, len, ", sharing this machine's %d core%s", c->cores_per_node, c->cores_per_node > 1 ? "s" : "");
    else
        buf[0] = 0;
}

bool cluster_machine(Cluster *c, int ranks, char *which, size_t which_len, Diag *d) {
    char path[1024], shared[64];
    if (!cluster_cache_path(path, sizeof path) || access(path, F_OK) != 0) {
        cluster_defaults(c, ranks);
        c->cores_per_node = machine_cores();
        sharing(c, ranks, shared, sizeof shared);
        snprintf(which, which_len, "stated defaults for one node of %d rank%s%s (no --cluster given, no calibration "
                 "cached)", ranks, ranks > 1 ? "s" : "", shared);
        return true;
    }
    if (!cluster_load(path, c, d)) {
        /* the loader's message, with what the file is and what to do */
        size_t n = strlen(d->msg);
        snprintf(d->msg + n, sizeof d->msg - n, " (the cached calibration of this machine: run cleave calibrate "
                 "--cache again, or delete it)");
        return false;
    }
    /* The calibration describes one rank per core of this machine; more
     * ranks than that share its cores, as they would under mpirun. */
    if (ranks > cluster_ranks(c)) {
        free(c->rank_speed);
        c->rank_speed = NULL;
        c->nodes = 1;
        c->ranks_per_node = ranks;
    }
    if (c->cores_per_node <= 0) c->cores_per_node = machine_cores(); /* a calibration from before it was measured */
    sharing(c, ranks, shared, sizeof shared);
    snprintf(which, which_len, "this machine's calibration (%s)%s", path, shared);
    return true;
}

bool cluster_cache_dir(const char *path, Diag *d) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(dir, 0755) != 0 && access(dir, F_OK) != 0)
            return diag_error(d, DIAG_IO, "%s: cannot create folder %s", path, dir);
        *p = '/';
    }
    return true;
}

bool cluster_open(const char *path, int ranks, Cluster *c, char *which, size_t which_len, Diag *d) {
    if (!path) return cluster_machine(c, ranks, which, which_len, d);
    if (!cluster_load(path, c, d)) return false;
    snprintf(which, which_len, "%s (%d node%s x %d ranks)", c->origin, c->nodes, c->nodes > 1 ? "s" : "",
             c->ranks_per_node);
    return true;
}
