// Tiled GEMM template: C[b, m, n] = sum_k A(b, m, k) * B(b, k, n).
//
// Build options (-D): TILE_M, TILE_N, TILE_K (the work-group's output tile and K step),
// WPT_M, WPT_N (outputs per work-item in each direction), SIZE_M, SIZE_N, SIZE_K, ROW_SUM (1: also
// sum A over k per row, stored with STORE_ROW: a bias gradient beside its weight gradient),
// A_K_FASTEST / B_N_FASTEST (1 when consecutive k of A / n of B are adjacent in memory, so that
// tile loads are coalesced along that direction).
//
// The code writer prepends what is specific to one use: INDEX_T, KERNEL_NAME, KERNEL_PARAMS, and
// the operand and epilogue functions load_a(b, m, k, ...), load_b(b, k, n, ...),
// store_c(b, m, n, value, ...) behind the macros LOAD_A, LOAD_B and STORE_C. Operands are
// arbitrary index maps (transposes, im2col gathers with padding); the tiles in local memory make
// each of them read once per work-group.

#define THREADS_M (TILE_M / WPT_M)
#define THREADS_N (TILE_N / WPT_N)
#define THREADS (THREADS_M * THREADS_N)

__kernel __attribute__((reqd_work_group_size(THREADS_N, THREADS_M, 1)))
void KERNEL_NAME(KERNEL_PARAMS)
{
    const int tn = get_local_id(0);
    const int tm = get_local_id(1);
    const int tid = tm * THREADS_N + tn;
    const INDEX_T n0 = (INDEX_T)get_group_id(0) * TILE_N;
    const INDEX_T m0 = (INDEX_T)get_group_id(1) * TILE_M;
    const INDEX_T b = get_group_id(2);

    __local float a_tile[TILE_K][TILE_M];
    __local float b_tile[TILE_K][TILE_N];

    float acc[WPT_M][WPT_N];
    for (int wm = 0; wm < WPT_M; ++wm)
        for (int wn = 0; wn < WPT_N; ++wn)
            acc[wm][wn] = 0.0f;
#if ROW_SUM
    float row_sum[WPT_M];
    for (int wm = 0; wm < WPT_M; ++wm)
        row_sum[wm] = 0.0f;
#endif

    for (INDEX_T k0 = 0; k0 < SIZE_K; k0 += TILE_K) {
        for (int e = tid; e < TILE_M * TILE_K; e += THREADS) {
#if A_K_FASTEST
            const int kk = e % TILE_K, mm = e / TILE_K;
#else
            const int mm = e % TILE_M, kk = e / TILE_M;
#endif
            const INDEX_T m = m0 + mm, k = k0 + kk;
            a_tile[kk][mm] = (m < SIZE_M && k < SIZE_K) ? LOAD_A(b, m, k) : 0.0f;
        }
        for (int e = tid; e < TILE_N * TILE_K; e += THREADS) {
#if B_N_FASTEST
            const int nn = e % TILE_N, kk = e / TILE_N;
#else
            const int kk = e % TILE_K, nn = e / TILE_K;
#endif
            const INDEX_T n = n0 + nn, k = k0 + kk;
            b_tile[kk][nn] = (n < SIZE_N && k < SIZE_K) ? LOAD_B(b, k, n) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int kk = 0; kk < TILE_K; ++kk) {
            float a_reg[WPT_M];
            float b_reg[WPT_N];
            for (int wm = 0; wm < WPT_M; ++wm)
                a_reg[wm] = a_tile[kk][tm + wm * THREADS_M];
#if ROW_SUM
            for (int wm = 0; wm < WPT_M; ++wm)
                row_sum[wm] += a_reg[wm];
#endif
            for (int wn = 0; wn < WPT_N; ++wn)
                b_reg[wn] = b_tile[kk][tn + wn * THREADS_N];
            for (int wm = 0; wm < WPT_M; ++wm)
                for (int wn = 0; wn < WPT_N; ++wn)
                    acc[wm][wn] = fma(a_reg[wm], b_reg[wn], acc[wm][wn]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int wm = 0; wm < WPT_M; ++wm) {
        const INDEX_T m = m0 + tm + wm * THREADS_M;
        for (int wn = 0; wn < WPT_N; ++wn) {
            const INDEX_T n = n0 + tn + wn * THREADS_N;
            if (m < SIZE_M && n < SIZE_N)
                STORE_C(b, m, n, acc[wm][wn]);
        }
    }
#if ROW_SUM
    // The fused reduction of A over k: the first column of work-items of the first block stores it.
    if (get_group_id(0) == 0 && tn == 0) {
        for (int wm = 0; wm < WPT_M; ++wm) {
            const INDEX_T m = m0 + tm + wm * THREADS_M;
            if (m < SIZE_M)
                STORE_ROW(b, m, row_sum[wm]);
        }
    }
#endif
}

#undef THREADS_M
#undef THREADS_N
#undef THREADS
