/* test_cluster.c - cluster files: the samples, the stated defaults, the
 * cost formulas against values worked out by hand, one exact message per
 * kind of malformed file, and no crash on truncated or corrupted text.
 *
 * The tests run in a temporary folder (made and removed by the fixture),
 * so files are written as "cluster.json" and messages read as the user
 * would see them.  With CLEAVE_CLUSTER_DUMP set to a folder, the defaults
 * and a re-written sample are left there for tests/py/test_cluster_schema.py
 * to validate against the schema. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support.h"
#include "cost/cluster.h"
#include "cost/simulate.h"

/* ---- the temporary folder ---- */

static char tmp_dir[64];
static char old_cwd[4096];

static void tmp_setup(void) {
    ck_assert_ptr_nonnull(getcwd(old_cwd, sizeof old_cwd));
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/cleave-cluster-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
    ck_assert_int_eq(chdir(tmp_dir), 0);
}

static void tmp_teardown(void) {
    DIR *dir = opendir(tmp_dir);
    for (struct dirent *e; dir && (e = readdir(dir));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", tmp_dir, e->d_name);
        unlink(path);
    }
    if (dir) closedir(dir);
    if (chdir(old_cwd) != 0) perror(old_cwd);
    rmdir(tmp_dir);
}

static void write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(text, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

static void write_file(const char *path, const char *text) { write_text(path, text, strlen(text)); }

/* ---- the test cluster ----
 *
 * 3 nodes of 4 ranks: ranks 0-3 on node 0, 4-7 on node 1, 8-11 on node 2.
 * Within a node a message costs 2 us + bytes / 10 GB/s, between nodes
 * 10 us + bytes / 1 GB/s.  Rank 5 computes at half speed. */
static const char BASE[] =
    "{\"format\": \"cleave-cluster\", \"version\": 1, \"name\": \"test\",\n"
    " \"nodes\": 3, \"ranks_per_node\": 4, \"memory_per_rank_bytes\": 1073741824,\n"
    " \"compute\": {\"gemm_gflops\": [[1e3, 2], [1e5, 6], [1e9, 10]], \"elementwise_gbps\": 4,\n"
    "             \"kernel_overhead_s\": 1e-7},\n"
    " \"intra_node\": {\"latency_s\": 2e-6, \"bandwidth_gbps\": 10},\n"
    " \"inter_node\": {\"latency_s\": 1e-5, \"bandwidth_gbps\": 1},\n"
    " \"rank_speed\": [1, 1, 1, 1, 1, 0.5, 1, 1, 1, 1, 1, 1]}\n";

static void load_ok(const char *path, Cluster *c) {
    Diag d = {0};
    ck_assert_msg(cluster_load(path, c, &d), "%s", d.msg);
    ck_assert_int_eq(d.code, DIAG_OK);
}

static Cluster load_base(void) {
    write_file("cluster.json", BASE);
    Cluster c;
    load_ok("cluster.json", &c);
    return c;
}

/* got == want up to rounding (values here are far from 0). */
static void near(double got, double want, const char *what) {
    ck_assert_msg(fabs(got - want) <= 1e-12 * fabs(want), "%s: got %.17g, expected %.17g", what, got, want);
}

/* The first entry of LINKS, which malformed_files edits. */
#define LINK0 "{\"nodes\": [1, 0], \"latency_s\": 1e-4, \"bandwidth_gbps\": 0.0125}"
/* BASE with links between two pairs of its nodes: 0 and 1 at 100 Mbit/s
 * (0.0125 GB/s), 1 and 2 at 25 Gb/s; 0 and 2 keep inter_node. */
#define LINKS \
    ",\n \"links\": [" LINK0 ",\n  {\"nodes\": [1, 2], \"latency_s\": 0, \"bandwidth_gbps\": 3.125}],\n \"rank_speed\""

/* BASE with `from` (the first place it occurs) replaced by `to`; without
 * `from`, just `to`. */
static char *edit_text(const char *base, const char *from, const char *to) {
    if (!from) return strdup(to);
    const char *at = strstr(base, from);
    ck_assert_msg(at != NULL, "\"%s\" is not in the test file", from);
    size_t head = (size_t)(at - base), n = strlen(base) - strlen(from) + strlen(to);
    char *s = malloc(n + 1);
    ck_assert_ptr_nonnull(s);
    memcpy(s, base, head);
    strcpy(s + head, to);
    strcat(s, at + strlen(from));
    return s;
}

/* BASE with links between its nodes (LINKS), malloc'd. */
static char *with_links(void) { return edit_text(BASE, ",\n \"rank_speed\"", LINKS); }

/* An edit of BASE, or of BASE with LINKS when `from` is only in that. */
static char *edit(const char *from, const char *to) {
    if (!from || strstr(BASE, from)) return edit_text(BASE, from, to);
    char *linked = with_links(), *s = edit_text(linked, from, to);
    free(linked);
    return s;
}

/* Parsing the text cluster_to_json gives for c yields the same numbers. */
static void same_cluster(const Cluster *a, const Cluster *b) {
    ck_assert_str_eq(a->source, b->source);
    ck_assert(a->name ? b->name && strcmp(a->name, b->name) == 0 : b->name == NULL);
    ck_assert_int_eq(a->nodes, b->nodes);
    ck_assert_int_eq(a->ranks_per_node, b->ranks_per_node);
    ck_assert_int_eq(a->memory_per_rank_bytes, b->memory_per_rank_bytes);
    ck_assert_int_eq(a->n_gemm, b->n_gemm);
    for (int i = 0; i < a->n_gemm; i++) {
        ck_assert(a->gemm_flops[i] == b->gemm_flops[i]);
        ck_assert(a->gemm_gflops[i] == b->gemm_gflops[i]);
    }
    ck_assert(a->elementwise_gbps == b->elementwise_gbps);
    ck_assert(a->kernel_overhead_s == b->kernel_overhead_s);
    ck_assert(a->step_overhead_s == b->step_overhead_s);
    ck_assert(a->intra_node.latency_s == b->intra_node.latency_s);
    ck_assert(a->intra_node.bandwidth_gbps == b->intra_node.bandwidth_gbps);
    ck_assert(a->inter_node.latency_s == b->inter_node.latency_s);
    ck_assert(a->inter_node.bandwidth_gbps == b->inter_node.bandwidth_gbps);
    ck_assert_int_eq(a->cores_per_node, b->cores_per_node);
    ck_assert_int_eq(a->n_links, b->n_links);
    for (int i = 0; i < a->n_links; i++) {
        ck_assert(a->links[i].a == b->links[i].a && a->links[i].b == b->links[i].b);
        ck_assert(a->links[i].link.latency_s == b->links[i].link.latency_s);
        ck_assert(a->links[i].link.bandwidth_gbps == b->links[i].link.bandwidth_gbps);
        ck_assert(a->links[i].link.allreduce_gbps == b->links[i].link.allreduce_gbps);
        ck_assert(a->links[i].link.send_overhead_s == b->links[i].link.send_overhead_s);
        ck_assert(a->links[i].link.send_gbps == b->links[i].link.send_gbps);
    }
    ck_assert(a->inter_node.allreduce_gbps == b->inter_node.allreduce_gbps);
    ck_assert(a->inter_node.send_overhead_s == b->inter_node.send_overhead_s);
    ck_assert(a->inter_node.send_gbps == b->inter_node.send_gbps);
    ck_assert(!a->rank_speed == !b->rank_speed);
    for (int r = 0; a->rank_speed && r < cluster_ranks(a); r++) ck_assert(a->rank_speed[r] == b->rank_speed[r]);
}

/* Writes c as JSON, reads it back, compares; with CLEAVE_CLUSTER_DUMP also
 * leaves the text there as `name`. */
static void round_trip(const Cluster *c, const char *name) {
    char *text = cluster_to_json(c);
    ck_assert_ptr_nonnull(text);
    Cluster back;
    Diag d = {0};
    ck_assert_msg(cluster_parse(text, strlen(text), name, &back, &d), "%s\n%s", d.msg, text);
    same_cluster(c, &back);
    ck_assert_str_eq(back.origin, name);
    cluster_free(&back);
    const char *dump = getenv("CLEAVE_CLUSTER_DUMP");
    if (dump && *dump) {
        char path[4096];
        snprintf(path, sizeof path, "%s/", dump);
        for (char *p = path + 1; *p; p++) /* mkdir -p; existing folders are fine */
            if (*p == '/') {
                *p = 0;
                mkdir(path, 0777);
                *p = '/';
            }
        snprintf(path, sizeof path, "%s/%s", dump, name);
        write_file(path, text);
    }
    free(text);
}

/* ---- tests ---- */

START_TEST(sample_files) {
    static const struct {
        const char *file;
        int nodes, per_node;
    } samples[] = {{"laptop.json", 1, 2}, {"8x8.json", 8, 8}, {"64x8.json", 64, 8}, {"512x8.json", 512, 8}};
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "samples/clusters/%s", samples[i].file);
        const char *path = test_src_path(rel);
        Cluster c;
        load_ok(path, &c);
        ck_assert_str_eq(c.origin, path);
        ck_assert_str_eq(c.source, "user");
        ck_assert_ptr_nonnull(c.name);
        ck_assert_int_eq(c.nodes, samples[i].nodes);
        ck_assert_int_eq(c.ranks_per_node, samples[i].per_node);
        ck_assert_int_eq(cluster_ranks(&c), samples[i].nodes * samples[i].per_node);
        ck_assert_int_ge(c.n_gemm, 1);
        /* Plausible: a faster link within the node than between nodes. */
        ck_assert(c.intra_node.bandwidth_gbps > c.inter_node.bandwidth_gbps);
        ck_assert(c.intra_node.latency_s < c.inter_node.latency_s);
        if (c.nodes > 1) {
            /* 64 GB per node shared by 8 ranks; 25 Gb/s Ethernet. */
            ck_assert_int_eq(c.memory_per_rank_bytes, (int64_t)8 << 30);
            ck_assert(c.inter_node.bandwidth_gbps >= 2.5 && c.inter_node.bandwidth_gbps <= 3.125);
            ck_assert(c.inter_node.latency_s >= 2e-6 && c.inter_node.latency_s <= 5e-6);
        }
        char dump_name[64];
        snprintf(dump_name, sizeof dump_name, "rewritten-%s", samples[i].file);
        round_trip(&c, dump_name);
        cluster_free(&c);
    }

    /* 8x8 gives rank_speed: node 7 (ranks 56-63) at 0.8. */
    Cluster c;
    load_ok(test_src_path("samples/clusters/8x8.json"), &c);
    ck_assert_ptr_nonnull(c.rank_speed);
    ck_assert(cluster_rank_speed(&c, 55) == 1.0);
    ck_assert(cluster_rank_speed(&c, 56) == 0.8);
    ck_assert(cluster_rank_speed(&c, 63) == 0.8);
    /* A ring over the first two nodes: every step is bounded by an
     * inter-node hop (7 -> 8, 15 -> 0) of B/16 bytes; 15 additions of
     * B/16 move 3 B/16 bytes each at the sample's 6 GB/s. */
    int ring[16];
    for (int r = 0; r < 16; r++) ring[r] = r;
    double b = 64e6;
    near(cluster_allreduce_seconds(&c, ring, 16, b),
         2.0 * 15 * (c.inter_node.latency_s + b / 16 / 3e9) + 15 * 3.0 * b / 16 / 6e9, "8x8: allreduce over 2 nodes");
    cluster_free(&c);
    cluster_free(&c); /* harmless twice */
}
END_TEST

START_TEST(stated_defaults) {
    Cluster c;
    cluster_defaults(&c, 4);
    ck_assert_str_eq(c.source, "defaults");
    ck_assert_str_eq(c.origin, "defaults");
    ck_assert_ptr_null(c.name);
    ck_assert_ptr_null(c.rank_speed);
    ck_assert_int_eq(c.nodes, 1);
    ck_assert_int_eq(c.ranks_per_node, 4);
    ck_assert_int_eq(cluster_ranks(&c), 4);
    ck_assert_int_eq(c.memory_per_rank_bytes, (int64_t)2 << 30);
    /* The numbers cluster.h states. */
    ck_assert(cluster_gemm_gflops(&c, 10) == 2.0);
    ck_assert(cluster_gemm_gflops(&c, 1e3) == 2.0);
    ck_assert(cluster_gemm_gflops(&c, 1e5) == 10.0);
    ck_assert(cluster_gemm_gflops(&c, 1e7) == 30.0);
    ck_assert(cluster_gemm_gflops(&c, 1e9) == 40.0);
    ck_assert(cluster_gemm_gflops(&c, 1e13) == 40.0);
    ck_assert(cluster_conv_gflops(&c, 1e3) == 4.6);
    ck_assert(cluster_conv_gflops(&c, 2.17e7) == 86.0);
    ck_assert(cluster_conv_gflops(&c, 1e13) == 125.0);
    ck_assert(c.step_overhead_s == 1e-5);
    ck_assert(c.elementwise_gbps == 5.0);
    ck_assert(c.kernel_overhead_s == 3e-7);
    ck_assert(c.intra_node.latency_s == 1e-6 && c.intra_node.bandwidth_gbps == 5.0);
    ck_assert(c.inter_node.latency_s == 5e-6 && c.inter_node.bandwidth_gbps == 1.25);
    /* One node: every message is intra-node. 1 us + 5e6 B / 5e9 B/s = 1.001 ms. */
    ck_assert(cluster_same_node(&c, 0, 3));
    near(cluster_p2p_seconds(&c, 0, 3, 5e6), 1e-6 + 1e-3, "defaults: p2p");
    round_trip(&c, "defaults-4.json");
    cluster_free(&c);

    cluster_defaults(&c, 1);
    ck_assert_int_eq(cluster_ranks(&c), 1);
    int only = 0;
    ck_assert(cluster_allreduce_seconds(&c, &only, 1, 1e9) == 0);
    round_trip(&c, "defaults-1.json");
    cluster_free(&c);
}
END_TEST

START_TEST(link_choice) {
    Cluster c = load_base();
    ck_assert_str_eq(c.origin, "cluster.json");
    ck_assert_str_eq(c.source, "user"); /* not given: written by hand */
    ck_assert_str_eq(c.name, "test");
    ck_assert_int_eq(cluster_ranks(&c), 12);
    ck_assert(cluster_same_node(&c, 0, 3));
    ck_assert(!cluster_same_node(&c, 3, 4));
    ck_assert(cluster_same_node(&c, 4, 7));
    ck_assert(!cluster_same_node(&c, 7, 8));
    ck_assert(cluster_same_node(&c, 11, 8));
    ck_assert(!cluster_same_node(&c, 0, 11));
    ck_assert_ptr_eq(cluster_link(&c, 1, 2), &c.intra_node);
    ck_assert_ptr_eq(cluster_link(&c, 2, 9), &c.inter_node);
    /* 1 MB within node 0: 2e-6 + 1e6 / 10e9 = 2e-6 + 1e-4 = 1.02e-4 s. */
    near(cluster_p2p_seconds(&c, 0, 1, 1e6), 1.02e-4, "p2p 0 -> 1");
    /* 1 MB from node 0 to node 1: 1e-5 + 1e6 / 1e9 = 1e-5 + 1e-3 = 1.01e-3 s. */
    near(cluster_p2p_seconds(&c, 0, 4, 1e6), 1.01e-3, "p2p 0 -> 4");
    near(cluster_p2p_seconds(&c, 4, 0, 1e6), 1.01e-3, "p2p 4 -> 0");
    /* An empty message still pays the latency; a message to oneself is none. */
    near(cluster_p2p_seconds(&c, 0, 1, 0), 2e-6, "empty p2p");
    ck_assert(cluster_p2p_seconds(&c, 5, 5, 1e6) == 0);
    cluster_free(&c);
}
END_TEST

/* Links between particular nodes replace inter_node for those pairs only,
 * in both directions, and survive a round trip. */
START_TEST(node_pair_links) {
    char *text = with_links();
    write_file("cluster.json", text);
    free(text);
    Cluster c;
    load_ok("cluster.json", &c);
    ck_assert_int_eq(c.n_links, 2);
    ck_assert(c.links[0].a == 0 && c.links[0].b == 1); /* given as [1, 0] */
    ck_assert_int_eq(cluster_node_of(&c, 7), 1);
    ck_assert_ptr_eq(cluster_link(&c, 0, 3), &c.intra_node);
    ck_assert_ptr_eq(cluster_link(&c, 3, 4), &c.links[0].link);
    ck_assert_ptr_eq(cluster_link(&c, 4, 3), &c.links[0].link);
    ck_assert_ptr_eq(cluster_link(&c, 9, 5), &c.links[1].link);
    ck_assert_ptr_eq(cluster_link(&c, 0, 11), &c.inter_node);
    /* 1 MB from node 0 to node 1: 1e-4 + 1e6 / 12.5e6 = 0.0801 s. */
    near(cluster_p2p_seconds(&c, 0, 4, 1e6), 0.0801, "p2p over the slow pair");
    near(cluster_p2p_seconds(&c, 8, 4, 1e6), 3.2e-4, "p2p over the fast pair");
    near(cluster_p2p_seconds(&c, 8, 0, 1e6), 1.01e-3, "p2p over inter_node");
    /* A ring over one rank of each node: its slowest hop is the slow pair. */
    int ring[] = {0, 4, 8};
    near(cluster_allreduce_seconds(&c, ring, 3, 3e6), 4 * (1e-4 + 1e6 / 12.5e6) + 2 * 3e6 / 4e9, "ring");
    round_trip(&c, "links.json");
    cluster_free(&c);
}
END_TEST

/* The linked cluster file with its first link (nodes 1 and 0, 100 us,
 * 0.0125 GB/s) given the extra fields `extra`, written and loaded. */
static void load_first_link(const char *extra, Cluster *c) {
    char link[256];
    snprintf(link, sizeof link, "{\"nodes\": [1, 0], \"latency_s\": 1e-4, \"bandwidth_gbps\": 0.0125, %s}", extra);
    char *linked = with_links();
    char *text = edit_text(linked, LINK0, link);
    free(linked);
    write_file("cluster.json", text);
    free(text);
    load_ok("cluster.json", c);
}

/* A link's allreduce rate prices the steps of a ring that cross it, and
 * nothing else: messages keep the bandwidth, rings within a node the
 * intra-node link. */
START_TEST(allreduce_rate) {
    Cluster c;
    load_first_link("\"allreduce_gbps\": 0.00625", &c);
    ck_assert(c.links[0].link.allreduce_gbps == 0.00625);
    ck_assert(c.links[1].link.allreduce_gbps == 0); /* not given */
    near(cluster_p2p_seconds(&c, 0, 4, 1e6), 0.0801, "p2p keeps the bandwidth");
    near(cluster_ring_seconds(&c, 0, 4, 1e6), 1e-4 + 1e6 / 6.25e6, "a ring step at the allreduce rate");
    near(cluster_ring_seconds(&c, 8, 4, 1e6), 3.2e-4, "a link without one: its bandwidth");
    near(cluster_ring_seconds(&c, 0, 1, 1e6), cluster_p2p_seconds(&c, 0, 1, 1e6), "within a node");
    int pair[] = {0, 4};
    near(cluster_allreduce_seconds(&c, pair, 2, 2e6), 2 * (1e-4 + 1e6 / 6.25e6) + 3e6 / 4e9, "ring of two");
    round_trip(&c, "allreduce.json");
    cluster_free(&c);
}
END_TEST

/* A link's sender's CPU is its own price: the message's time keeps the
 * latency and bandwidth; a link without the fields charges nothing, and a
 * rank sending to itself nothing either. */
START_TEST(send_cpu) {
    Cluster c;
    load_first_link("\"send_overhead_s\": 2e-5, \"send_gbps\": 0.5", &c);
    ck_assert(c.links[0].link.send_overhead_s == 2e-5 && c.links[0].link.send_gbps == 0.5);
    ck_assert(c.links[1].link.send_overhead_s == 0 && c.links[1].link.send_gbps == 0); /* not given */
    near(cluster_send_cpu_seconds(&c, 0, 4, 1e6), 2e-5 + 1e6 / 5e8, "overhead and bytes");
    near(cluster_send_cpu_seconds(&c, 4, 0, 0), 2e-5, "an empty message: the overhead");
    near(cluster_p2p_seconds(&c, 0, 4, 1e6), 0.0801, "the message keeps its latency and bandwidth");
    ck_assert(cluster_send_cpu_seconds(&c, 8, 4, 1e6) == 0);
    ck_assert(cluster_send_cpu_seconds(&c, 0, 0, 1e6) == 0);
    round_trip(&c, "send-cpu.json");
    cluster_free(&c);
}
END_TEST

/* Ranks beyond a node's cores time-share them: compute slows by ranks /
 * cores on that node only, counting the ranks the plan uses. */
START_TEST(core_sharing) {
    Cluster c = load_base();
    ck_assert_int_eq(c.cores_per_node, 0); /* not stated: a core per rank */
    ck_assert(cluster_core_share(&c, 3, 12) == 1.0);
    c.cores_per_node = 2;
    ck_assert(cluster_core_share(&c, 0, 1) == 1.0);  /* one rank on node 0 */
    ck_assert(cluster_core_share(&c, 1, 2) == 1.0);  /* two ranks, two cores */
    ck_assert(cluster_core_share(&c, 0, 3) == 2.0 / 3);
    ck_assert(cluster_core_share(&c, 3, 4) == 0.5);
    ck_assert(cluster_core_share(&c, 3, 12) == 0.5);
    ck_assert(cluster_core_share(&c, 4, 5) == 1.0);  /* node 1 runs rank 4 alone */
    ck_assert(cluster_core_share(&c, 9, 11) == 2.0 / 3); /* node 2 runs 8, 9, 10 */
    /* pinned round robin where a node is oversubscribed, as rt_bind.c does */
    ck_assert_int_eq(cluster_core_of(&c, 1, 2), -1); /* two ranks, two cores */
    ck_assert_int_eq(cluster_core_of(&c, 0, 3), 0);
    ck_assert_int_eq(cluster_core_of(&c, 1, 3), 1);
    ck_assert_int_eq(cluster_core_of(&c, 2, 3), 0);
    ck_assert_int_eq(cluster_core_of(&c, 3, 12), 1);
    ck_assert_int_eq(cluster_core_of(&c, 4, 5), -1); /* node 1 runs rank 4 alone */
    ck_assert_int_eq(cluster_core_of(&c, 10, 11), 0); /* node 2: ranks 8, 9, 10 on cores 0, 1, 0 */
    /* written and read back with the field */
    char *text = cluster_to_json(&c);
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_nonnull(strstr(text, "\"cores_per_node\": 2"));
    Cluster back;
    Diag d = {0};
    ck_assert_msg(cluster_parse(text, strlen(text), "back.json", &back, &d), "%s", d.msg);
    ck_assert_int_eq(back.cores_per_node, 2);
    free(text);
    cluster_free(&back);
    cluster_free(&c);
}
END_TEST

START_TEST(ring_allreduce) {
    Cluster c = load_base();
    /* Node 0 only, 4 MB over 4 ranks: chunks of 1 MB, each hop intra-node
     * at 1.02e-4 s (link_choice), 2 (4 - 1) = 6 steps: 6.12e-4 s. */
    int node0[] = {0, 1, 2, 3};
    /* Plus the reduce-scatter's 3 additions of 1 MB chunks, 3 MB moved
     * each at 4 GB/s: 3 * 3e6 / 4e9 = 2.25e-3 s, in every 4-rank case. */
    near(cluster_allreduce_seconds(&c, node0, 4, 4e6), 6 * 1.02e-4 + 2.25e-3, "ring on node 0");
    /* 0, 1 on node 0 and 4, 5 on node 1: hops 0->1 and 4->5 intra-node,
     * 1->4 and 5->0 inter-node at 1.01e-3 s for 1 MB; every step waits
     * for the slow hop: 6 * 1.01e-3 = 6.06e-3 s. */
    int two_nodes[] = {0, 1, 4, 5};
    near(cluster_allreduce_seconds(&c, two_nodes, 4, 4e6), 6 * 1.01e-3 + 2.25e-3, "ring over two nodes");
    /* The same ranks in another ring order cross nodes on every hop, at
     * the same slowest link: the same time. */
    int zigzag[] = {0, 4, 1, 5};
    near(cluster_allreduce_seconds(&c, zigzag, 4, 4e6), 6 * 1.01e-3 + 2.25e-3, "zigzag ring");
    /* Two ranks on different nodes, 2 MB: 2 (2 - 1) = 2 steps of 1 MB at
     * 1.01e-3 s: 2.02e-3 s, and one addition of 1 MB: 3e6 / 4e9 = 7.5e-4. */
    int pair[] = {3, 8};
    near(cluster_allreduce_seconds(&c, pair, 2, 2e6), 2.02e-3 + 7.5e-4, "pair");
    /* All 12 ranks, 12 MB: 2 * 11 = 22 steps of 1 MB over an inter-node
     * hop: 22 * 1.01e-3 = 2.222e-2 s; 11 additions of 1 MB: 8.25e-3 s. */
    int all[12];
    for (int r = 0; r < 12; r++) all[r] = r;
    near(cluster_allreduce_seconds(&c, all, 12, 12e6), 22 * 1.01e-3 + 8.25e-3, "all ranks");
    /* One rank has nothing to exchange. */
    ck_assert(cluster_allreduce_seconds(&c, all, 1, 12e6) == 0);
    ck_assert(cluster_allreduce_seconds(&c, all, 0, 12e6) == 0);
    /* Rank speed is compute only: rank 5 (half speed) does not slow the ring. */
    int with5[] = {4, 5};
    near(cluster_allreduce_seconds(&c, with5, 2, 2e6), 2 * 1.02e-4 + 7.5e-4, "ring with the slow rank");
    cluster_free(&c);
}
END_TEST

START_TEST(gemm_curve_and_memory_kernels) {
    Cluster c = load_base();
    /* Curve [[1e3, 2], [1e5, 6], [1e9, 10]], linear in log10(flops):
     * 1e4 is halfway from 1e3 to 1e5: 2 + 0.5 * (6 - 2) = 4;
     * 1e7 is halfway from 1e5 to 1e9: 6 + 0.5 * (10 - 6) = 8;
     * 1e6 is a quarter of the way: 6 + 0.25 * 4 = 7;
     * clamped to 2 below 1e3 and to 10 above 1e9. */
    near(cluster_gemm_gflops(&c, 1e3), 2, "rate at 1e3");
    near(cluster_gemm_gflops(&c, 1e4), 4, "rate at 1e4");
    near(cluster_gemm_gflops(&c, 1e5), 6, "rate at 1e5");
    near(cluster_gemm_gflops(&c, 1e6), 7, "rate at 1e6");
    near(cluster_gemm_gflops(&c, 1e7), 8, "rate at 1e7");
    near(cluster_gemm_gflops(&c, 1e9), 10, "rate at 1e9");
    ck_assert(cluster_gemm_gflops(&c, 1) == 2);
    ck_assert(cluster_gemm_gflops(&c, 0) == 2);
    ck_assert(cluster_gemm_gflops(&c, 1e15) == 10);
    /* The rate rises with the size in between. */
    double prev = 0;
    for (double f = 500; f < 1e10; f *= 1.5) {
        double g = cluster_gemm_gflops(&c, f);
        ck_assert_msg(g >= prev, "rate falls at %g: %g after %g", f, g, prev);
        prev = g;
    }
    /* 1e4 FLOPs at 4 GFLOP/s: 2.5e-6 s; on rank 5 (speed 0.5): 5e-6 s. */
    near(cluster_gemm_seconds(&c, 0, 1e4), 2.5e-6, "gemm on rank 0");
    near(cluster_gemm_seconds(&c, 5, 1e4), 5e-6, "gemm on rank 5");
    /* 1e10 FLOPs, past the curve, at 10 GFLOP/s: 1 s. */
    near(cluster_gemm_seconds(&c, 0, 1e10), 1.0, "gemm past the curve");
    ck_assert(cluster_gemm_seconds(&c, 0, 0) == 0);
    /* 1 GB through memory-bound kernels at 4 GB/s: 0.25 s; on rank 5: 0.5 s. */
    near(cluster_mem_seconds(&c, 0, 1e9), 0.25, "memory-bound on rank 0");
    near(cluster_mem_seconds(&c, 5, 1e9), 0.5, "memory-bound on rank 5");
    ck_assert(cluster_mem_seconds(&c, 0, 0) == 0);
    ck_assert(cluster_rank_speed(&c, 5) == 0.5);
    ck_assert(cluster_rank_speed(&c, 6) == 1.0);
    cluster_free(&c);

    /* A one-point curve is a constant rate. */
    char *text = strdup(BASE);
    char *at = strstr(text, "[[1e3, 2], [1e5, 6], [1e9, 10]]");
    ck_assert_ptr_nonnull(at);
    const char *one = "[[1e6, 5]]";
    memcpy(at, one, strlen(one));
    memmove(at + strlen(one), at + strlen("[[1e3, 2], [1e5, 6], [1e9, 10]]"),
            strlen(at + strlen("[[1e3, 2], [1e5, 6], [1e9, 10]]")) + 1);
    write_file("one.json", text);
    free(text);
    load_ok("one.json", &c);
    ck_assert_int_eq(c.n_gemm, 1);
    ck_assert(cluster_gemm_gflops(&c, 10) == 5 && cluster_gemm_gflops(&c, 1e6) == 5 &&
              cluster_gemm_gflops(&c, 1e12) == 5);
    cluster_free(&c);
}
END_TEST

/* BASE with the first `from` replaced by `to` (malloc'd); the whole text
 * `to` when from is NULL. */
/* Loading `text` as cluster.json fails with exactly "cluster.json: msg". */
static void expect_error(const char *text, DiagCode code, const char *msg) {
    write_file("cluster.json", text);
    Cluster c;
    memset(&c, 0xab, sizeof c); /* whatever the caller had */
    Diag d = {0};
    ck_assert_msg(!cluster_load("cluster.json", &c, &d), "loaded, expected: %s\n%s", msg, text);
    char want[1024];
    snprintf(want, sizeof want, "cluster.json: %s", msg);
    ck_assert_str_eq(d.msg, want);
    ck_assert_msg(d.code == code, "%s: code %s, expected %s", d.msg, diag_code_name(d.code), diag_code_name(code));
    ck_assert_ptr_null(strchr(d.msg, '\n'));
    /* Nothing left to free. */
    ck_assert_ptr_null(c.name);
    ck_assert_ptr_null(c.rank_speed);
}

START_TEST(malformed_files) {
    static const struct {
        const char *from, *to;
        DiagCode code;
        const char *msg;
    } cases[] = {
        {"\"bandwidth_gbps\": 10", "\"bandwidth_gbps\": 0", DIAG_FORMAT,
         "\"intra_node\".\"bandwidth_gbps\" must be a positive number"},
        {"\"latency_s\": 1e-5", "\"latency_s\": -1", DIAG_FORMAT,
         "\"inter_node\".\"latency_s\" must be a non-negative number"},
        {"\"kernel_overhead_s\": 1e-7", "\"kernel_overhead_s\": \"1e-7\"", DIAG_FORMAT,
         "\"compute\".\"kernel_overhead_s\" must be a non-negative number"},
        {"\"elementwise_gbps\": 4", "\"elementwise_gbps\": null", DIAG_FORMAT,
         "\"compute\".\"elementwise_gbps\" must be a positive number"},
        {"[1, 1, 1, 1, 1, 0.5, 1, 1, 1, 1, 1, 1]", "[1, 1, 1]", DIAG_FORMAT,
         "\"rank_speed\" has 3 entries, expected 12 (nodes x ranks_per_node)"},
        {"0.5", "\"fast\"", DIAG_FORMAT, "\"rank_speed\"[5] must be a positive number"},
        {"[1, 1, 1, 1, 1, 0.5, 1, 1, 1, 1, 1, 1]", "{}", DIAG_FORMAT,
         "\"rank_speed\" must be an array of positive numbers"},
        {"\"nodes\"", "\"nodse\"", DIAG_FORMAT,
         "unknown field \"nodse\" (known: format, version, name, source, nodes, ranks_per_node, cores_per_node, "
         "memory_per_rank_bytes, compute, intra_node, inter_node, links, rank_speed)"},
        {LINK0, "{\"nodes\": [0, 3], \"latency_s\": 1e-4, \"bandwidth_gbps\": 0.0125}", DIAG_FORMAT,
         "\"links\"[0].\"nodes\": node 3 is not one of the 3 nodes"},
        {LINK0, "{\"nodes\": [1, 1], \"latency_s\": 1e-4, \"bandwidth_gbps\": 0.0125}", DIAG_FORMAT,
         "\"links\"[0].\"nodes\": a link joins two different nodes, not node 1 to itself"},
        {LINK0, "{\"nodes\": [0, 1.5], \"latency_s\": 1e-4, \"bandwidth_gbps\": 0.0125}", DIAG_FORMAT,
         "\"links\"[0].\"nodes\" must be a pair [x, y] of node numbers"},
        {LINK0, "{\"nodes\": [0], \"latency_s\": 1e-4, \"bandwidth_gbps\": 0.0125}", DIAG_FORMAT,
         "\"links\"[0].\"nodes\" must be a pair [x, y] of node numbers"},
        {LINK0, "{\"latency_s\": 1e-4, \"bandwidth_gbps\": 0.0125}", DIAG_FORMAT,
         "missing required field \"links\"[0].\"nodes\""},
        {LINK0, "{\"nodes\": [0, 1], \"latency_s\": 1e-4}", DIAG_FORMAT,
         "missing required field \"links\"[0].\"bandwidth_gbps\""},
        {LINK0, "{\"nodes\": [0, 1], \"latency_s\": 1e-4, \"bandwidth_gbps\": -1}", DIAG_FORMAT,
         "\"links\"[0].\"bandwidth_gbps\" must be a positive number"},
        {LINK0, "{\"nodes\": [0, 1], \"latency_s\": 1e-4, \"bandwith_gbps\": 1}", DIAG_FORMAT,
         "unknown field \"links\"[0].\"bandwith_gbps\" (known: nodes, latency_s, bandwidth_gbps, allreduce_gbps, "
         "send_overhead_s, send_gbps)"},
        {LINK0, "{\"nodes\": [0, 1], \"latency_s\": 1e-4, \"bandwidth_gbps\": 1, \"allreduce_gbps\": 0}", DIAG_FORMAT,
         "\"links\"[0].\"allreduce_gbps\" must be a positive number"},
        {"\"inter_node\": {\"latency_s\": 1e-5, \"bandwidth_gbps\": 1}",
         "\"inter_node\": {\"latency_s\": 1e-5, \"bandwidth_gbps\": 1, \"allreduce_gbps\": \"fast\"}", DIAG_FORMAT,
         "\"inter_node\".\"allreduce_gbps\" must be a positive number"},
        {"\"inter_node\": {\"latency_s\": 1e-5, \"bandwidth_gbps\": 1}",
         "\"inter_node\": {\"latency_s\": 1e-5, \"bandwidth_gbps\": 1, \"allreduce_gpbs\": 1}", DIAG_FORMAT,
         "unknown field \"inter_node\".\"allreduce_gpbs\" (known: latency_s, bandwidth_gbps, allreduce_gbps, "
         "send_overhead_s, send_gbps)"},
        {LINK0, "{\"nodes\": [0, 1], \"latency_s\": 1e-4, \"bandwidth_gbps\": 1, \"send_overhead_s\": -1e-6}",
         DIAG_FORMAT, "\"links\"[0].\"send_overhead_s\" must be a non-negative number"},
        {LINK0, "{\"nodes\": [0, 1], \"latency_s\": 1e-4, \"bandwidth_gbps\": 1, \"send_gbps\": 0}", DIAG_FORMAT,
         "\"links\"[0].\"send_gbps\" must be a positive number"},
        {"\"inter_node\": {\"latency_s\": 1e-5, \"bandwidth_gbps\": 1}",
         "\"inter_node\": {\"latency_s\": 1e-5, \"bandwidth_gbps\": 1, \"send_gbps\": \"fast\"}", DIAG_FORMAT,
         "\"inter_node\".\"send_gbps\" must be a positive number"},
        {LINK0, "{\"nodes\": [2, 1], \"latency_s\": 1e-4, \"bandwidth_gbps\": 1}", DIAG_FORMAT,
         "\"links\": nodes 1 and 2 are given twice"},
        {LINK0, "[0, 1]", DIAG_FORMAT, "\"links\"[0] must be an object"},
        {"[" LINK0 ",\n  {\"nodes\": [1, 2], \"latency_s\": 0, \"bandwidth_gbps\": 3.125}]", "{}", DIAG_FORMAT,
         "\"links\" must be an array of node-pair links"},
        {"\"links\": [" LINK0, "\"links\": 5, \"old_links\": [" LINK0, DIAG_FORMAT,
         "unknown field \"old_links\" (known: format, version, name, source, nodes, ranks_per_node, "
         "cores_per_node, memory_per_rank_bytes, compute, intra_node, inter_node, links, rank_speed)"},
        {"\"ranks_per_node\": 4,", "\"ranks_per_node\": 4, \"cores_per_node\": 0,", DIAG_FORMAT,
         "\"cores_per_node\" must be a positive integer"},
        {"\"ranks_per_node\": 4,", "\"ranks_per_node\": 4, \"cores_per_node\": 2.5,", DIAG_FORMAT,
         "\"cores_per_node\" must be a positive integer"},
        {"\"elementwise_gbps\"", "\"elementwise_gpbs\"", DIAG_FORMAT,
         "unknown field \"compute\".\"elementwise_gpbs\" (known: gemm_gflops, conv_gflops, elementwise_gbps, "
         "kernel_overhead_s, step_overhead_s)"},
        {"\"kernel_overhead_s\": 1e-7", "\"kernel_overhead_s\": 1e-7, \"step_overhead_s\": -2", DIAG_FORMAT,
         "\"compute\".\"step_overhead_s\" must be a non-negative number"},
        {",\n \"inter_node\": {\"latency_s\": 1e-5, \"bandwidth_gbps\": 1}", "", DIAG_FORMAT,
         "missing required field \"inter_node\""},
        {"\"latency_s\": 2e-6, ", "", DIAG_FORMAT, "missing required field \"intra_node\".\"latency_s\""},
        {"{\"latency_s\": 2e-6, \"bandwidth_gbps\": 10}", "5", DIAG_FORMAT, "\"intra_node\" must be an object"},
        {"\"cleave-cluster\"", "\"cleave-plan\"", DIAG_FORMAT, "\"format\" must be \"cleave-cluster\""},
        {"\"format\": \"cleave-cluster\", ", "", DIAG_FORMAT, "missing required field \"format\""},
        {"\"version\": 1", "\"version\": 2", DIAG_UNSUPPORTED,
         "\"version\" 2 is not supported (this cleave reads version 1)"},
        {"\"version\": 1", "\"version\": \"1\"", DIAG_FORMAT, "\"version\" must be an integer"},
        {"\"nodes\": 3", "\"nodes\": 2.5", DIAG_FORMAT, "\"nodes\" must be a positive integer"},
        {"\"ranks_per_node\": 4", "\"ranks_per_node\": 0", DIAG_FORMAT,
         "\"ranks_per_node\" must be a positive integer"},
        {"\"nodes\": 3", "\"nodes\": 1048576", DIAG_LIMIT,
         "1048576 nodes x 4 ranks per node is more than the limit of 1048576 ranks"},
        {"\"nodes\": 3", "\"nodes\": 2000000", DIAG_LIMIT, "\"nodes\" is more than the limit of 1048576"},
        {"1073741824", "1e30", DIAG_LIMIT, "\"memory_per_rank_bytes\" is more than the limit of 9223372036854775807"},
        {"1073741824", "-1", DIAG_FORMAT, "\"memory_per_rank_bytes\" must be a positive integer"},
        {"[1e5, 6]", "[1e2, 6]", DIAG_FORMAT,
         "\"compute\".\"gemm_gflops\"[1]: problem sizes must be strictly ascending (100 after 1000)"},
        {"[1e5, 6]", "[1e3, 6]", DIAG_FORMAT,
         "\"compute\".\"gemm_gflops\"[1]: problem sizes must be strictly ascending (1000 after 1000)"},
        {"[1e5, 6]", "[1e5]", DIAG_FORMAT,
         "\"compute\".\"gemm_gflops\"[1] must be a pair [flops, gflops] of positive numbers"},
        {"[1e9, 10]", "[1e9, 0]", DIAG_FORMAT,
         "\"compute\".\"gemm_gflops\"[2] must be a pair [flops, gflops] of positive numbers"},
        {"[[1e3, 2], [1e5, 6], [1e9, 10]]", "[]", DIAG_FORMAT,
         "\"compute\".\"gemm_gflops\" must be a non-empty array of [flops, gflops] pairs"},
        {"\"name\": \"test\"", "\"name\": \"test\", \"source\": \"measured\"", DIAG_FORMAT,
         "\"source\" must be \"user\", \"calibrated\" or \"defaults\""},
        {"\"name\": \"test\"", "\"name\": 5", DIAG_FORMAT, "\"name\" must be a string"},
        /* JSON itself: jansson's words, with the line and column. */
        {"\"nodes\": 3,", "\"nodes\": 3,,", DIAG_FORMAT,
         "invalid JSON at line 2, column 13: string or '}' expected near ','"},
        {"\"nodes\": 3", "\"nodes\": 3, \"nodes\": 3", DIAG_FORMAT,
         "invalid JSON at line 2, column 20: duplicate object key near '\"nodes\"'"},
        {NULL, "", DIAG_FORMAT, "empty file, not a cluster file"},
        {NULL, "[1, 2]", DIAG_FORMAT, "the top level must be an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = edit(cases[i].from, cases[i].to);
        expect_error(text, cases[i].code, cases[i].msg);
        free(text);
    }

    /* 65 curve points, one more than allowed. */
    char curve[2048] = "[";
    for (int i = 0; i < 65; i++)
        snprintf(curve + strlen(curve), sizeof curve - strlen(curve), "%s[%d, 1]", i ? ", " : "", i + 1);
    strcat(curve, "]");
    char *text = edit("[[1e3, 2], [1e5, 6], [1e9, 10]]", curve);
    expect_error(text, DIAG_FORMAT, "\"compute\".\"gemm_gflops\" has 65 points, at most 64 are allowed");
    free(text);

    /* Unreadable. */
    Cluster c;
    Diag d = {0};
    ck_assert(!cluster_load("missing.json", &c, &d));
    ck_assert_int_eq(d.code, DIAG_IO);
    ck_assert_str_eq(d.msg, "missing.json: cannot open: No such file or directory");
    d = (Diag){0};
    ck_assert(!cluster_load(".", &c, &d));
    ck_assert_int_eq(d.code, DIAG_IO);
    ck_assert_str_eq(d.msg, ".: not a regular file (a folder)");
}
END_TEST

START_TEST(accepted_variants) {
    /* What the schema accepts loads too: integers written as reals, a
     * latency and kernel overhead of 0, every source, no rank_speed. */
    char *a = edit("\"nodes\": 3, \"ranks_per_node\": 4", "\"nodes\": 3.0, \"ranks_per_node\": 4e0");
    char *b = edit("\"latency_s\": 2e-6", "\"latency_s\": 0");
    char *e = edit(", \"name\": \"test\"", ", \"source\": \"calibrated\"");
    char *f = edit(",\n \"rank_speed\": [1, 1, 1, 1, 1, 0.5, 1, 1, 1, 1, 1, 1]", "");
    char *g = edit("\"version\": 1", "\"version\": 1.0");
    /* A name needing escapes: a quote, a backslash, a tab, a non-ASCII letter. */
    char *h = edit("\"name\": \"test\"", "\"name\": \"q\\\"uote\\\\ \\t\\u00e9\"");
    char *texts[] = {a, b, e, f, g, h};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        write_file("cluster.json", texts[i]);
        Cluster c;
        load_ok("cluster.json", &c);
        ck_assert_int_eq(cluster_ranks(&c), 12);
        if (texts[i] == b) ck_assert(c.intra_node.latency_s == 0 && cluster_p2p_seconds(&c, 0, 1, 0) == 0);
        if (texts[i] == e) {
            ck_assert_str_eq(c.source, "calibrated");
            ck_assert_ptr_null(c.name);
        }
        if (texts[i] == h) ck_assert_str_eq(c.name, "q\"uote\\ \t\xc3\xa9");
        if (texts[i] == f) {
            ck_assert_ptr_null(c.rank_speed);
            ck_assert(cluster_rank_speed(&c, 5) == 1.0);
        }
        round_trip(&c, "variant.json");
        cluster_free(&c);
        free(texts[i]);
    }
}
END_TEST

/* Every failure is one line naming the text, and leaves nothing to free. */
static void check_outcome(bool ok, const Cluster *c, const Diag *d, const char *what) {
    if (ok) {
        ck_assert_int_ge(c->n_gemm, 1);
        ck_assert_int_ge(cluster_ranks(c), 1);
        ck_assert(c->memory_per_rank_bytes > 0 && c->elementwise_gbps > 0 && c->kernel_overhead_s >= 0);
        ck_assert(c->intra_node.bandwidth_gbps > 0 && c->inter_node.bandwidth_gbps > 0);
        return;
    }
    ck_assert_msg(d->code != DIAG_OK && strncmp(d->msg, "cluster.json: ", 14) == 0, "%s: '%s'", what, d->msg);
    ck_assert_ptr_null(strchr(d->msg, '\n'));
    ck_assert_ptr_null(c->name);
    ck_assert_ptr_null(c->rank_speed);
}

START_TEST(truncated_and_corrupted_text) {
    size_t n = strlen(BASE), closing = (size_t)(strrchr(BASE, '}') - BASE);
    /* Every prefix: only those reaching the closing brace load. */
    for (size_t len = 0; len <= n; len++) {
        Cluster c;
        Diag d = {0};
        bool ok = cluster_parse(BASE, len, "cluster.json", &c, &d);
        ck_assert_msg(ok == (len > closing), "prefix of %zu bytes: %s", len, ok ? "loaded" : d.msg);
        check_outcome(ok, &c, &d, "prefix");
        cluster_free(&c);
    }
    /* Some through files, as the user gives them. */
    for (size_t len = 0; len <= n; len += 37) {
        write_text("cluster.json", BASE, len);
        Cluster c;
        Diag d = {0};
        bool ok = cluster_load("cluster.json", &c, &d);
        ck_assert(ok == (len > closing));
        check_outcome(ok, &c, &d, "file prefix");
        cluster_free(&c);
    }
    /* Every byte replaced by characters that change types, signs, nesting
     * and string boundaries. */
    static const char subst[] = {'0', '-', '"', '}', ']', '[', 'e', '.', ',', '\0', '\\', '\xff'};
    char *text = malloc(n);
    ck_assert_ptr_nonnull(text);
    int loaded = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof subst; k++) {
            memcpy(text, BASE, n);
            text[i] = subst[k];
            Cluster c;
            Diag d = {0};
            bool ok = cluster_parse(text, n, "cluster.json", &c, &d);
            check_outcome(ok, &c, &d, "corrupted");
            loaded += ok;
            cluster_free(&c);
        }
    }
    free(text);
    /* Some survive (a digit turned into another), most do not. */
    ck_assert_int_gt(loaded, 0);
    ck_assert_int_lt(loaded, (int)(n * sizeof subst) / 2);
}
END_TEST

START_TEST(large_clusters) {
    Cluster c;
    load_ok(test_src_path("samples/clusters/512x8.json"), &c);
    ck_assert_int_eq(cluster_ranks(&c), 4096);
    int *all = malloc(4096 * sizeof *all);
    ck_assert_ptr_nonnull(all);
    for (int r = 0; r < 4096; r++) all[r] = r;
    /* A ring over every rank in order: the inter-node hops bound each of
     * its 2 * 4095 steps of B / 4096 bytes, and 4095 additions of a 1 MB
     * chunk move 3 MB each at the memory rate. */
    double b = 4096.0 * 1e6;
    near(cluster_allreduce_seconds(&c, all, 4096, b),
         2.0 * 4095 * (c.inter_node.latency_s + 1e6 / (c.inter_node.bandwidth_gbps * 1e9)) +
             4095 * 3e6 / (c.elementwise_gbps * 1e9),
         "4096 ranks");
    ck_assert(cluster_same_node(&c, 4095, 4088) && !cluster_same_node(&c, 4095, 4087));
    free(all);
    cluster_free(&c);
}
END_TEST

/* The simulator's clocks follow the walk (plan/walk.h) of a hand-made
 * 2-rank step: rank 0 sends B bytes to rank 1 and waits for the send, then
 * both allreduce X bytes.  Each rank starts after the runtime's fixed work
 * t0; the message arrives at t0 + p2p(B), which is when rank 1 receives it
 * and rank 0's send completes; the allreduce starts there, once both have
 * reached it, and the step ends with the loss's reduction. */
START_TEST(simulated_times_follow_the_walk) {
    Cluster c = load_base();
    c.step_overhead_s = 1e-5;
    const int64_t B = 1000000, X = 4000;
    int pair[] = {0, 1};
    PlanGroup group = {2, pair};
    PlanStep s0[] = {{.kind = STEP_SEND, .peer = 1, .tag = 7, .bytes = B, .micro = 0},
                     {.kind = STEP_SEND_WAIT, .peer = 1, .tag = 7, .micro = 0},
                     {.kind = STEP_ALLREDUCE, .group = 0, .bytes = X, .micro = -1}};
    PlanStep s1[] = {{.kind = STEP_RECV, .peer = 0, .tag = 7, .bytes = B, .micro = 0},
                     {.kind = STEP_ALLREDUCE, .group = 0, .bytes = X, .micro = -1}};
    RankPlan ranks[2] = {{.rank = 0, .n_train = 3, .train = s0, .arena_bytes = 100},
                         {.rank = 1, .n_train = 2, .train = s1, .arena_bytes = 300}};
    Plan p = {.n_ranks = 2, .ranks = ranks, .n_groups = 1, .groups = &group};
    SimResult r;
    Diag d = {0};
    ck_assert_msg(simulate_plan(&p, &c, &r, &d), "%s", d.msg);
    double t0 = c.step_overhead_s, arrive = t0 + cluster_p2p_seconds(&c, 0, 1, (double)B);
    double done = arrive + cluster_allreduce_seconds(&c, pair, 2, (double)X);
    ck_assert(arrive > t0 && done > arrive);
    near(r.step_s, done + cluster_allreduce_seconds(&c, pair, 2, 16), "step");
    for (int k = 0; k < 2; k++) {
        near(r.ranks[k].end_s, done, "end");
        near(r.ranks[k].busy_s, t0, "busy");
        near(r.ranks[k].wait_s, done - t0, "wait");
        ck_assert_int_eq(r.ranks[k].reduced_bytes, X);
    }
    ck_assert_int_eq(r.ranks[0].sent_bytes, B);
    ck_assert_int_eq(r.ranks[1].sent_bytes, 0);
    ck_assert_int_eq(r.comm_bytes, B + 2 * X);
    ck_assert_int_eq(r.peak_bytes, 300);
    /* in the walk's order: the fixed work, rank 1's receive (rank 0 is
     * still waiting for its send), rank 0's send, then the allreduce for
     * both, completed by rank 0's arrival */
    struct { int rank; char kind; SimWait wait; int peer; double t0, t1; } want[] = {
        {0, 'U', SIM_WAIT_NONE, -1, 0, t0},         {1, 'U', SIM_WAIT_NONE, -1, 0, t0},
        {1, 'W', SIM_WAIT_RECV, 0, t0, arrive},     {0, 'W', SIM_WAIT_SEND, 1, t0, arrive},
        {0, 'W', SIM_WAIT_ALLREDUCE, -1, arrive, done}, {1, 'W', SIM_WAIT_ALLREDUCE, -1, arrive, done},
    };
    ck_assert_int_eq(r.n_events, 6);
    for (int i = 0; i < 6; i++) {
        const SimEvent *e = &r.events[i];
        ck_assert_msg(e->rank == want[i].rank && e->kind == want[i].kind && e->wait == want[i].wait &&
                          e->peer == want[i].peer,
                      "event %d: rank %d kind %c wait %d peer %d", i, e->rank, e->kind, e->wait, e->peer);
        near(e->t1, want[i].t1, "event end");
        if (want[i].t0 > 0) near(e->t0, want[i].t0, "event start");
    }
    sim_result_free(&r);

    /* Rank 1 waits for a message rank 0 never sends, and rank 0 for the
     * receipt of the one it sends: the walk cannot end. */
    s0[0].tag = 8;
    s0[1].tag = 8;
    ck_assert(!simulate_plan(&p, &c, &r, &d));
    ck_assert_str_eq(d.msg, "simulating the plan: rank 0 is stuck at step 1");
    cluster_free(&c);
}
END_TEST

/* Messages between nodes share the nodes' links (cost/nic.h).  On BASE
 * (10 us + bytes / 1 GB/s between nodes), ranks 0 and 1 of node 0 each
 * send B bytes to a rank of node 1 at the same time: node 0's outgoing
 * link carries 2 B, so the second message arrives B / bandwidth after the
 * first, at t0 + latency + 2 B / bandwidth.  A message the other way (rank
 * 5 to rank 2) uses the other direction of the links, and a message
 * within node 0 none: neither waits.  Pairs of nodes with a link of their
 * own (BASE with LINKS) share the node's link all the same. */
START_TEST(messages_share_a_link) {
    const int64_t B = 1000000;
    PlanStep s1[] = {{.kind = STEP_SEND, .peer = 5, .tag = 2, .bytes = B, .micro = 0},
                     {.kind = STEP_SEND_WAIT, .peer = 5, .tag = 2, .micro = 0}};
    PlanStep s2[] = {{.kind = STEP_RECV, .peer = 5, .tag = 3, .bytes = B, .micro = 0}};
    PlanStep s3[] = {{.kind = STEP_SEND, .peer = 0, .tag = 5, .bytes = B, .micro = 0},
                     {.kind = STEP_SEND_WAIT, .peer = 0, .tag = 5, .micro = 0}};
    PlanStep s4[] = {{.kind = STEP_RECV, .peer = 0, .tag = 1, .bytes = B, .micro = 0}};
    PlanStep s5[] = {{.kind = STEP_SEND, .peer = 2, .tag = 3, .bytes = B, .micro = 0},
                     {.kind = STEP_RECV, .peer = 1, .tag = 2, .bytes = B, .micro = 0},
                     {.kind = STEP_SEND_WAIT, .peer = 2, .tag = 3, .micro = 0}};
    PlanStep s0[] = {{.kind = STEP_SEND, .peer = 4, .tag = 1, .bytes = B, .micro = 0},
                      {.kind = STEP_RECV, .peer = 3, .tag = 5, .bytes = B, .micro = 0},
                      {.kind = STEP_SEND_WAIT, .peer = 4, .tag = 1, .micro = 0}};
    RankPlan ranks[6] = {{.rank = 0, .n_train = 3, .train = s0}, {.rank = 1, .n_train = 2, .train = s1},
                         {.rank = 2, .n_train = 1, .train = s2},  {.rank = 3, .n_train = 2, .train = s3},
                         {.rank = 4, .n_train = 1, .train = s4},  {.rank = 5, .n_train = 3, .train = s5}};
    Plan p = {.n_ranks = 6, .ranks = ranks};
    for (int linked = 0; linked < 2; linked++) {
        Cluster c;
        if (linked) {
            char *text = with_links();
            write_file("cluster.json", text);
            free(text);
            load_ok("cluster.json", &c);
        } else {
            c = load_base();
        }
        c.step_overhead_s = 1e-5;
        const ClusterLink *l = cluster_link(&c, 0, 4);
        double t0 = c.step_overhead_s, one = (double)B / (l->bandwidth_gbps * 1e9);
        SimResult r;
        Diag d = {0};
        ck_assert_msg(simulate_plan(&p, &c, &r, &d), "%s", d.msg);
        near(r.ranks[4].end_s, t0 + l->latency_s + one, "the first message over node 0's link");
        near(r.ranks[5].end_s, t0 + l->latency_s + 2 * one, "the second, after the first");
        near(r.ranks[2].end_s, t0 + l->latency_s + one, "the other direction: alone");
        near(r.ranks[0].end_s, t0 + l->latency_s + one, "rank 0's send");
        near(r.ranks[3].end_s, t0 + cluster_p2p_seconds(&c, 3, 0, (double)B), "within node 0: alone");
        sim_result_free(&r);
        cluster_free(&c);
    }
}
END_TEST

/* Two allreduces at once over groups {0, 4} and {1, 5}, each a ring of
 * two ranks on nodes 0 and 1: each sends X bytes along both of its edges
 * (2 (n - 1) chunks of X / n), so node 0's outgoing link carries 2 X and
 * the pair completes at start + 2 X / bandwidth, later than either ring
 * alone (2 (latency + X / 2 / bandwidth) plus one addition). */
START_TEST(collectives_share_a_link) {
    Cluster c = load_base();
    c.step_overhead_s = 1e-5;
    const int64_t X = 4000000;
    int g0[] = {0, 4}, g1[] = {1, 5};
    PlanGroup groups[] = {{2, g0}, {2, g1}};
    PlanStep a[] = {{.kind = STEP_ALLREDUCE, .group = 0, .bytes = X, .micro = -1}};
    PlanStep b[] = {{.kind = STEP_ALLREDUCE, .group = 1, .bytes = X, .micro = -1}};
    RankPlan ranks[6] = {{.rank = 0, .n_train = 1, .train = a}, {.rank = 1, .n_train = 1, .train = b},
                         {.rank = 2},                          {.rank = 3},
                         {.rank = 4, .n_train = 1, .train = a}, {.rank = 5, .n_train = 1, .train = b}};
    Plan p = {.n_ranks = 6, .ranks = ranks, .n_groups = 2, .groups = groups};
    SimResult r;
    Diag d = {0};
    ck_assert_msg(simulate_plan(&p, &c, &r, &d), "%s", d.msg);
    double t0 = c.step_overhead_s, alone = cluster_allreduce_seconds(&c, g0, 2, (double)X);
    double shared = 2.0 * (double)X / (c.inter_node.bandwidth_gbps * 1e9);
    ck_assert(shared > alone);
    near(r.ranks[0].end_s, t0 + alone, "the first ring: alone");
    near(r.ranks[1].end_s, t0 + shared, "the second ring: after the first's traffic");
    sim_result_free(&r);
    cluster_free(&c);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cluster");
    TCase *tc = tcase_create("cluster");
    tcase_add_unchecked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, sample_files);
    tcase_add_test(tc, stated_defaults);
    tcase_add_test(tc, link_choice);
    tcase_add_test(tc, node_pair_links);
    tcase_add_test(tc, allreduce_rate);
    tcase_add_test(tc, send_cpu);
    tcase_add_test(tc, ring_allreduce);
    tcase_add_test(tc, core_sharing);
    tcase_add_test(tc, gemm_curve_and_memory_kernels);
    tcase_add_test(tc, malformed_files);
    tcase_add_test(tc, accepted_variants);
    tcase_add_test(tc, truncated_and_corrupted_text);
    tcase_add_test(tc, large_clusters);
    tcase_add_test(tc, simulated_times_follow_the_walk);
    tcase_add_test(tc, messages_share_a_link);
    tcase_add_test(tc, collectives_share_a_link);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
