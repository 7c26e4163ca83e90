/* This CPU's fp32 FMA peak: twelve independent AVX-512 FMA chains per OpenMP thread, best of five runs.
 * The ceiling the dense kernels' GFLOP/s are read against (docs/performance.md).
 *
 *   gcc -O2 -mavx512f -fopenmp scripts/fma_peak.c -o /tmp/fma_peak
 *   OMP_NUM_THREADS=2 /tmp/fma_peak     # every core;  OMP_NUM_THREADS=1: one core
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>

int main(void) {
    const long steps = 200000000 / 24;  /* FMA steps per chain */
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        float sink = 0;
        double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : sink)
        {
            __m512 acc[12];
            const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
            for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps((float)i);
            for (long n = 0; n < steps; n++) {
#pragma GCC unroll 12
                for (int i = 0; i < 12; i++) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
            }
            for (int i = 0; i < 12; i++) sink += _mm512_reduce_add_ps(acc[i]);  /* keeps the chains live */
        }
        double secs = omp_get_wtime() - t0;
        double flops = 2.0 * 16 * 12 * steps * omp_get_max_threads();
        if (flops / secs > best) best = flops / secs;
        printf("%.1f GFLOP/s (%g)\n", flops / secs / 1e9, sink);
    }
    printf("best %.1f GFLOP/s on %d threads\n", best / 1e9, omp_get_max_threads());
    return 0;
}
