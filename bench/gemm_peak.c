/* gemm_peak.c - this core's clock and fused multiply-add throughput, for
 * bench_gemm.py's peak figure.  Built by the script with
 * `cc -O2 -march=native`; prints one JSON line:
 *
 *   clock_ghz      a chain of dependent register-to-register integer adds
 *                  (one cycle each on x86 cores) timed against
 *                  CLOCK_MONOTONIC: the clock this core really runs at
 *   vector_floats  floats per vector register the FMA loop used
 *   fma_gflops     float32 GFLOP/s of a loop of independent vector FMAs
 *                  (2 flops per lane): the most any kernel can get here
 *
 * Each figure is the best of 25 short tries (20 ms and 10 ms), since other
 * jobs on the machine only ever make them lower. */
#include <stdio.h>
#include <time.h>

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per add of a dependent chain of `n` x 100 adds. */
static double add_chain(long n) {
    unsigned long x = 0, one = 1;
    __asm__ volatile("" : "+r"(one)); /* a register operand: some cores fold chains of immediate adds */
    double t0 = now();
    for (long i = 0; i < n; i++) {
#if defined(__x86_64__)
#define ADD10 "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        __asm__ volatile(ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 : "+r"(x) : "r"(one));
#else
        for (int k = 0; k < 100; k++) __asm__ volatile("" : "+r"(x)), x++;
#endif
    }
    double t = now() - t0;
    if (x != (unsigned long)n * 100) fprintf(stderr, "add chain miscounted\n");
    return t / ((double)n * 100);
}

#if defined(__AVX512F__)
#define VF 16
typedef __m512 vf;
#define VSET1 _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
#define VADD _mm512_add_ps
#define VSUM(v) _mm512_reduce_add_ps(v)
#elif defined(__FMA__)
#define VF 8
typedef __m256 vf;
#define VSET1 _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
#define VADD _mm256_add_ps
static float vsum8(__m256 v) {
    float t[8];
    _mm256_storeu_ps(t, v);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#define VSUM(v) vsum8(v)
#endif

#ifdef VF
/* GFLOP/s of n iterations of 12 independent FMA chains (enough to cover
 * a 4-cycle latency on two units). */
static double fma_rate(long n) {
    vf a = VSET1(0.999999f), b = VSET1(1e-7f);
    vf s0 = VSET1(1), s1 = VSET1(2), s2 = VSET1(3), s3 = VSET1(4), s4 = VSET1(5), s5 = VSET1(6);
    vf s6 = VSET1(7), s7 = VSET1(8), s8 = VSET1(9), s9 = VSET1(10), s10 = VSET1(11), s11 = VSET1(12);
    double t0 = now();
    for (long i = 0; i < n; i++) {
        s0 = VFMA(s0, a, b), s1 = VFMA(s1, a, b), s2 = VFMA(s2, a, b), s3 = VFMA(s3, a, b);
        s4 = VFMA(s4, a, b), s5 = VFMA(s5, a, b), s6 = VFMA(s6, a, b), s7 = VFMA(s7, a, b);
        s8 = VFMA(s8, a, b), s9 = VFMA(s9, a, b), s10 = VFMA(s10, a, b), s11 = VFMA(s11, a, b);
        __asm__ volatile("" : "+v"(s0), "+v"(s1), "+v"(s2), "+v"(s3), "+v"(s4), "+v"(s5));
        __asm__ volatile("" : "+v"(s6), "+v"(s7), "+v"(s8), "+v"(s9), "+v"(s10), "+v"(s11));
    }
    double t = now() - t0;
    vf s = VADD(VADD(VADD(s0, s1), VADD(s2, s3)), VADD(VADD(s4, s5), VADD(s6, s7)));
    s = VADD(s, VADD(VADD(s8, s9), VADD(s10, s11)));
    if (VSUM(s) == 0.0f) fprintf(stderr, "unexpected sum\n");
    return (double)n * 12 * VF * 2 / t * 1e-9;
}
#endif

int main(void) {
    double best_cycle = 1e9;
    add_chain(1000000); /* wake the core up */
    for (int i = 0; i < 25; i++) {
        double s = add_chain(500000);
        if (s < best_cycle) best_cycle = s;
    }
    double fma = 0;
    int width = 0;
#ifdef VF
    width = VF;
    fma_rate(3000000);
    for (int i = 0; i < 25; i++) {
        double r = fma_rate(3000000);
        if (r > fma) fma = r;
    }
#endif
    printf("{\"clock_ghz\": %.4f, \"vector_floats\": %d, \"fma_gflops\": %.3f}\n", 1e-9 / best_cycle, width, fma);
    return 0;
}
