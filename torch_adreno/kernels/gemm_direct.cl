// Direct GEMM template (no local memory, no barriers): C[b, m, n] = sum_k A(b, m, k) * B(b, k, n).
//
// For CPU OpenCL devices (PoCL), where local memory is ordinary cache and barriers are emulated:
// each work-item computes a WPT_M x 8 block of C with float8 accumulators. The 8 lanes of B are
// read through LOAD_B one by one; the compiler merges them into one vector load when they are
// adjacent, and otherwise each lane streams its own row (a transposed weight), which caches well.
// A multiply-add is written as a * b + c (with -cl-mad-enable): PoCL does not vectorise fma().
//
// Build options (-D): WPT_M, SIZE_M, SIZE_N, SIZE_K, ROW_SUM (1: also sum A over k per row and
// store it with STORE_ROW). The code writer prepends INDEX_T, KERNEL_NAME, KERNEL_PARAMS, KERNEL_LOCALS and the
// LOAD_A / LOAD_B / STORE_C / STORE_ROW functions, as for gemm.cl.

#define LANES 8

__kernel void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    const INDEX_T n0 = (INDEX_T)get_global_id(0) * LANES;
    const INDEX_T m0 = (INDEX_T)get_global_id(1) * WPT_M;
    const INDEX_T b = get_global_id(2);

    // Out-of-range rows and lanes compute on clamped, valid indices and are not stored, so the
    // loop below has no branches.
    INDEX_T ns[LANES];
    for (int l = 0; l < LANES; ++l)
        ns[l] = n0 + l < SIZE_N ? n0 + l : SIZE_N - 1;
    INDEX_T ms[WPT_M];
    for (int wm = 0; wm < WPT_M; ++wm)
        ms[wm] = m0 + wm < SIZE_M ? m0 + wm : SIZE_M - 1;

    float8 acc[WPT_M];
    for (int wm = 0; wm < WPT_M; ++wm)
        acc[wm] = (float8)(0.0f);
#if ROW_SUM
    // Kahan-compensated, as in gemm.cl: a bias gradient is a long sum that cancels.
    float row_sum[WPT_M], row_sum_c[WPT_M];
    for (int wm = 0; wm < WPT_M; ++wm)
        row_sum[wm] = row_sum_c[wm] = 0.0f;
#endif

#define K_LOOP(SUM_ROWS)                                                                          \
    for (INDEX_T k = 0; k < SIZE_K; ++k) {                                                        \
        const float8 bv = (float8)(LOAD_B(b, k, ns[0]), LOAD_B(b, k, ns[1]), LOAD_B(b, k, ns[2]), \
                                   LOAD_B(b, k, ns[3]), LOAD_B(b, k, ns[4]), LOAD_B(b, k, ns[5]), \
                                   LOAD_B(b, k, ns[6]), LOAD_B(b, k, ns[7]));                     \
        for (int wm = 0; wm < WPT_M; ++wm) {                                                      \
            const float a = LOAD_A(b, ms[wm], k);                                                 \
            SUM_ROWS(wm, a);                                                                      \
            acc[wm] = a * bv + acc[wm];                                                           \
        }                                                                                         \
    }
#define NO_ROW_SUM(wm, a)
#define ADD_ROW_SUM(wm, a)                                                                        \
    {                                                                                             \
        const float y = (a) - row_sum_c[wm], t = row_sum[wm] + y;                                 \
        row_sum_c[wm] = (t - row_sum[wm]) - y;                                                    \
        row_sum[wm] = t;                                                                          \
    }

#if ROW_SUM
    // Only the first column block sums rows: a separate copy of the loop keeps the others lean.
    if (n0 == 0) {
        K_LOOP(ADD_ROW_SUM)
    } else {
        K_LOOP(NO_ROW_SUM)
    }
#else
    K_LOOP(NO_ROW_SUM)
#endif

#if ROW_SUM
    // The fused reduction of A over k: one column block stores it.
    if (n0 == 0) {
        for (int wm = 0; wm < WPT_M; ++wm)
            if (m0 + wm < SIZE_M)
                STORE_ROW(b, m0 + wm, row_sum[wm]);
    }
#endif

    for (int wm = 0; wm < WPT_M; ++wm) {
        if (m0 + wm >= SIZE_M)
            break;
        const float lane[LANES] = {acc[wm].s0, acc[wm].s1, acc[wm].s2, acc[wm].s3,
                                   acc[wm].s4, acc[wm].s5, acc[wm].s6, acc[wm].s7};
        for (int l = 0; l < LANES; ++l)
            if (n0 + l < SIZE_N)
                STORE_C(b, m0 + wm, n0 + l, lane[l]);
    }
}

#undef LANES
#undef K_LOOP
#undef NO_ROW_SUM
#undef ADD_ROW_SUM
