/* The host's physical limits per precision, printed as one JSON object: fp32 FMA, the bf16 and int8 dot products
 * of the best instruction the CPU has, and streaming copy bandwidth. 12 independent accumulator chains per thread
 * (enough to hide every x86 FMA/dot latency), best of 5 runs. Built and run by host_peaks.py; OMP_NUM_THREADS sets
 * the threads. Counting: a multiply-add is 2 operations, for every precision.
 *
 * int8 without VNNI: AVX2's vpmaddwd (16 int16 products summed in pairs into 8 int32 per instruction) is the
 * widest exact int8 dot product, so it is int8's limit there; bf16 without AVX512_BF16 is fp32 FMA on widened
 * values, so its limit is fp32's. */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define STEPS 4000000L
#define BEST(expr, ops) ({ double best_ = 0; for (int r_ = 0; r_ < 5; r_++) { double t_ = omp_get_wtime(); expr; \
    double g_ = (ops) / (omp_get_wtime() - t_); if (g_ > best_) best_ = g_; } best_; })
static volatile float fsink; static volatile long isink;

__attribute__((target("avx512f"))) static void fma512(void) {
#pragma omp parallel
  { __m512 a[12]; const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f); float s = 0;
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < STEPS; n++) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c); }
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    fsink = s; }
}
__attribute__((target("avx2,fma"))) static void fma256(void) {
#pragma omp parallel
  { __m256 a[12]; const __m256 b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f); float s = 0, o[8];
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long n = 0; n < STEPS; n++) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c); }
    for (int i = 0; i < 12; i++) { _mm256_storeu_ps(o, a[i]); s += o[0]; }
    fsink = s; }
}
__attribute__((target("avx512f,avx512bf16,avx512bw"))) static void bf16dot(void) {
#pragma omp parallel
  { __m512 a[12]; __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3a00); float s = 0;
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < STEPS; n++) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y); }
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    fsink = s; }
}
__attribute__((target("avx512f,avx512vnni,avx512bw"))) static void vnni(void) {
#pragma omp parallel
  { __m512i a[12]; const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(2); long s = 0;
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
    for (long n = 0; n < STEPS; n++) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], x, y); }
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_epi32(a[i]);
    isink = s; }
}
__attribute__((target("avx2"))) static void maddwd(void) {
#pragma omp parallel
  { __m256i a[12]; const __m256i x = _mm256_set1_epi16(3), y = _mm256_set1_epi16(5); long s = 0; int o[8];
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi32(i);
    for (long n = 0; n < STEPS; n++) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; i++) a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(x, y)); }
    for (int i = 0; i < 12; i++) { _mm256_storeu_si256((__m256i *)o, a[i]); s += o[0]; }
    isink = s; }
}
static void copy(const char *a, char *b, size_t n) {
#pragma omp parallel for
  for (long i = 0; i < (long)(n / 4096); i++) memcpy(b + 4096 * i, a + 4096 * i, 4096);
}

int main(void) {
  int t = omp_get_max_threads();
  __builtin_cpu_init();
  double fp32 = 0, bf16 = 0, int8 = 0;
  const char *fp32_how = "none", *bf16_how = "fp32 FMA on widened bf16", *int8_how = "none";
  if (__builtin_cpu_supports("avx512f")) { fp32 = BEST(fma512(), 2.0 * 16 * 12 * STEPS * t) / 1e9; fp32_how = "vfmadd (AVX-512)"; }
  else if (__builtin_cpu_supports("fma")) { fp32 = BEST(fma256(), 2.0 * 8 * 12 * STEPS * t) / 1e9; fp32_how = "vfmadd (AVX2)"; }
  bf16 = fp32;
  if (__builtin_cpu_supports("avx512bf16")) { bf16 = BEST(bf16dot(), 2.0 * 32 * 12 * STEPS * t) / 1e9; bf16_how = "vdpbf16ps (AVX512_BF16)"; }
  if (__builtin_cpu_supports("avx512vnni")) { int8 = BEST(vnni(), 2.0 * 64 * 12 * STEPS * t) / 1e9; int8_how = "vpdpbusd (AVX512_VNNI)"; }
  else if (__builtin_cpu_supports("avx2")) { int8 = BEST(maddwd(), 2.0 * 16 * 12 * STEPS * t) / 1e9; int8_how = "vpmaddwd (AVX2, int16 pairs)"; }
  size_t n = 256UL << 20; char *a = aligned_alloc(64, n), *b = aligned_alloc(64, n);
  memset(a, 1, n); memset(b, 2, n);
  double bw = BEST(copy(a, b, n), 2.0 * n) / 1e9;
  printf("{\"threads\": %d, \"fp32_gflops\": %.2f, \"fp32_instruction\": \"%s\", \"bf16_gflops\": %.2f, "
         "\"bf16_instruction\": \"%s\", \"int8_gops\": %.2f, \"int8_instruction\": \"%s\", \"copy_gbs\": %.2f}\n",
         t, fp32, fp32_how, bf16, bf16_how, int8, int8_how, bw);
  return b[12345] == 7;
}
