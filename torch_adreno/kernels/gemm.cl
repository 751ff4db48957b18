// Tiled GEMM template: C[b, m, n] = sum_k A(b, m, k) * B(b, k, n).
//
// Build options (-D): TILE_M, TILE_N, TILE_K (the work-group's output tile and K step),
// WPT_M, WPT_N (outputs per work-item in each direction), VW_M, VW_N (1, 2 or 4: each work-item
// owns runs of VW adjacent rows / columns, so that it reads its operands from local memory as
// float2/float4), SIZE_M, SIZE_N, SIZE_K, ROW_SUM (1: also sum A over k per row, stored with
// STORE_ROW: a bias gradient beside its weight gradient), A_K_FASTEST / B_N_FASTEST (1 when
// consecutive k of A / n of B are adjacent in memory, so that tile loads are coalesced along
// that direction), K_GRANULE (1 or TILE_K: the operands' K index is passed as a K step and an offset
// in it, kt * K_GRANULE + kk, so that what an index map computes from the step alone, such as an
// im2col gather's kernel tap, is computed once per step for the whole work-group and not per element).
//
// The code writer prepends what is specific to one use: INDEX_T, KERNEL_NAME, KERNEL_PARAMS,
// KERNEL_LOCALS (written from the kernel's parameter records), and the operand and epilogue
// functions load_a(b, m, kt, kk, ...), load_b(b, kt, kk, n, ...), store_c(b, m, n, value, ...)
// (named after the kernel's symbol through KERNEL_HELPER) behind the macros LOAD_A, LOAD_B and
// STORE_C, and the prefetch's A_RAW_T / FETCH_A / FINISH_A (and B's): the fetched element and its
// operand value.
// Operands are arbitrary index maps (transposes, im2col gathers with padding); the tiles in local
// memory make each of them read once per work-group.
//
// The next K step's operands are loaded from global memory into registers while the current one
// is multiplied out of local memory, so that load latency hides behind the arithmetic. They are
// held as fetched (A_RAW_T, B_RAW_T: a 16-bit operand's bits) and finished into floats
// (FINISH_A, FINISH_B) only as they are stored into the tiles: arithmetic on a loaded value where
// it is loaded waits for the load, before the multiplications it should overlap (16-bit GEMMs
// widened at the load run well behind float32 ones on a desktop GPU). The prefetch is not
// skipped at the last K step (its loads are all out of range there, so none is made): a branch
// around it ends the code the loads can hide in at the branch. Rows of
// the tiles are padded by 4 floats: keeps float4 alignment and spreads the stores of a
// k-fastest operand over the memory banks.

#if K_GRANULE == 1
#define K_STEP(k) (k)
#elif K_GRANULE == TILE_K
#define K_STEP(k) ((k) / TILE_K)
#else
#error "K_GRANULE must be 1 or TILE_K"
#endif
#define THREADS_M (TILE_M / WPT_M)
#define THREADS_N (TILE_N / WPT_N)
#define THREADS (THREADS_M * THREADS_N)
#define PITCH_M (TILE_M + 4)
#define PITCH_N (TILE_N + 4)
#define A_TILE_FLOATS (TILE_K * PITCH_M)
#define B_TILE_FLOATS (TILE_K * PITCH_N)
#define LOADS_A ((TILE_M * TILE_K + THREADS - 1) / THREADS)
#define LOADS_B ((TILE_N * TILE_K + THREADS - 1) / THREADS)
// Row (column) of the tile held in a work-item's w-th register: runs of VW adjacent ones, the runs
// of neighbouring work-items side by side.
#define ROW_OF(tm, w) (((tm) + ((w) / VW_M) * THREADS_M) * VW_M + (w) % VW_M)
#define COL_OF(tn, w) (((tn) + ((w) / VW_N) * THREADS_N) * VW_N + (w) % VW_N)

#if VW_M == 4
#define READ_A(dst, kk, tm, j) { const float4 v_ = *(__local const float4 *)&a_tile[(kk) * PITCH_M + ((tm) + (j) * THREADS_M) * 4]; \
    dst[(j) * 4] = v_.x; dst[(j) * 4 + 1] = v_.y; dst[(j) * 4 + 2] = v_.z; dst[(j) * 4 + 3] = v_.w; }
#elif VW_M == 2
#define READ_A(dst, kk, tm, j) { const float2 v_ = *(__local const float2 *)&a_tile[(kk) * PITCH_M + ((tm) + (j) * THREADS_M) * 2]; \
    dst[(j) * 2] = v_.x; dst[(j) * 2 + 1] = v_.y; }
#else
#define READ_A(dst, kk, tm, j) { dst[j] = a_tile[(kk) * PITCH_M + (tm) + (j) * THREADS_M]; }
#endif
#if VW_N == 4
#define READ_B(dst, kk, tn, j) { const float4 v_ = *(__local const float4 *)&b_tile[(kk) * PITCH_N + ((tn) + (j) * THREADS_N) * 4]; \
    dst[(j) * 4] = v_.x; dst[(j) * 4 + 1] = v_.y; dst[(j) * 4 + 2] = v_.z; dst[(j) * 4 + 3] = v_.w; }
#elif VW_N == 2
#define READ_B(dst, kk, tn, j) { const float2 v_ = *(__local const float2 *)&b_tile[(kk) * PITCH_N + ((tn) + (j) * THREADS_N) * 2]; \
    dst[(j) * 2] = v_.x; dst[(j) * 2 + 1] = v_.y; }
#else
#define READ_B(dst, kk, tn, j) { dst[j] = b_tile[(kk) * PITCH_N + (tn) + (j) * THREADS_N]; }
#endif

// A work-item's i-th element of the A (B) tile, e = tid + i * THREADS: its place (kk, mm) in the
// tile, walked along the direction that is adjacent in global memory (the fast one). Where the
// work-group's items fill whole lines of the fast direction, the place along it is the same for
// every i and is written from tid alone: the loads then visibly share the index arithmetic of that
// direction (an im2col gather's division of k, a weight gradient's per element), which a
// compiler cannot see through (tid + i * THREADS) % extent of a signed tid.
#if A_K_FASTEST
#define A_FAST_EXTENT TILE_K
#else
#define A_FAST_EXTENT TILE_M
#endif
#if B_N_FASTEST
#define B_FAST_EXTENT TILE_N
#else
#define B_FAST_EXTENT TILE_K
#endif
#if THREADS % A_FAST_EXTENT == 0
#define A_FAST(i) (tid % A_FAST_EXTENT)
#define A_SLOW(i) (tid / A_FAST_EXTENT + (i) * (THREADS / A_FAST_EXTENT))
#else
#define A_FAST(i) ((tid + (i) * THREADS) % A_FAST_EXTENT)
#define A_SLOW(i) ((tid + (i) * THREADS) / A_FAST_EXTENT)
#endif
#if THREADS % B_FAST_EXTENT == 0
#define B_FAST(i) (tid % B_FAST_EXTENT)
#define B_SLOW(i) (tid / B_FAST_EXTENT + (i) * (THREADS / B_FAST_EXTENT))
#else
#define B_FAST(i) ((tid + (i) * THREADS) % B_FAST_EXTENT)
#define B_SLOW(i) ((tid + (i) * THREADS) / B_FAST_EXTENT)
#endif
#if A_K_FASTEST
#define A_KK(i) A_FAST(i)
#define A_MM(i) A_SLOW(i)
#else
#define A_KK(i) A_SLOW(i)
#define A_MM(i) A_FAST(i)
#endif
#if B_N_FASTEST
#define B_KK(i) B_SLOW(i)
#define B_NN(i) B_FAST(i)
#else
#define B_KK(i) B_FAST(i)
#define B_NN(i) B_SLOW(i)
#endif

// The operands of the K step starting at k1 into the prefetch registers (none past SIZE_K).
#define FETCH_STEP(k1) \
    for (int i = 0; i < LOADS_A; ++i) { \
        const int e = tid + i * THREADS; \
        const INDEX_T m = m0 + A_MM(i), k = (k1) + A_KK(i); \
        a_next[i] = (e < TILE_M * TILE_K && m < SIZE_M && k < SIZE_K) ? FETCH_A(b, m, K_STEP(k1), A_KK(i)) : (A_RAW_T)0; \
    } \
    for (int i = 0; i < LOADS_B; ++i) { \
        const int e = tid + i * THREADS; \
        const INDEX_T n = n0 + B_NN(i), k = (k1) + B_KK(i); \
        b_next[i] = (e < TILE_N * TILE_K && n < SIZE_N && k < SIZE_K) ? FETCH_B(b, K_STEP(k1), B_KK(i), n) : (B_RAW_T)0; \
    }
// The prefetch registers into the tiles.
#define STORE_TILES \
    for (int i = 0; i < LOADS_A; ++i) { \
        const int e = tid + i * THREADS; \
        if (e < TILE_M * TILE_K) \
            a_tile[A_KK(i) * PITCH_M + A_MM(i)] = FINISH_A(a_next[i]); \
    } \
    for (int i = 0; i < LOADS_B; ++i) { \
        const int e = tid + i * THREADS; \
        if (e < TILE_N * TILE_K) \
            b_tile[B_KK(i) * PITCH_N + B_NN(i)] = FINISH_B(b_next[i]); \
    }
#if ROW_SUM
#define ADD_ROW_SUMS \
    for (int wm = 0; wm < WPT_M; ++wm) { \
        const float y = a_reg[wm] - row_sum_c[wm], t_ = row_sum[wm] + y; \
        row_sum_c[wm] = (t_ - row_sum[wm]) - y; \
        row_sum[wm] = t_; \
    }
#else
#define ADD_ROW_SUMS
#endif
// K_UNROLL (0: the compiler's choice) unrolls the K step's loop that many times: NVIDIA's
// compiler keeps it rolled, so each kk waits for its own local reads before its multiply-adds.
#define PRAGMA_TEXT(x) _Pragma(#x)
#define UNROLL_PRAGMA(n) PRAGMA_TEXT(unroll n)
#if K_UNROLL
#define UNROLL_K_STEP UNROLL_PRAGMA(K_UNROLL)
#else
#define UNROLL_K_STEP
#endif
// One K step multiplied out of the tiles into the accumulators.
#define MULTIPLY_TILES \
    { \
        UNROLL_K_STEP \
        for (int kk = 0; kk < TILE_K; ++kk) { \
            float a_reg[WPT_M]; \
            float b_reg[WPT_N]; \
            for (int j = 0; j < WPT_M / VW_M; ++j) \
                READ_A(a_reg, kk, tm, j) \
            ADD_ROW_SUMS \
            for (int j = 0; j < WPT_N / VW_N; ++j) \
                READ_B(b_reg, kk, tn, j) \
            for (int wm = 0; wm < WPT_M; ++wm) \
                for (int wn = 0; wn < WPT_N; ++wn) \
                    acc[wm][wn] = fma(a_reg[wm], b_reg[wn], acc[wm][wn]); \
        } \
    }

__kernel __attribute__((reqd_work_group_size(THREADS_N, THREADS_M, 1)))
void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    const int tn = get_local_id(0);
    const int tm = get_local_id(1);
    const int tid = tm * THREADS_N + tn;
    const INDEX_T n0 = (INDEX_T)get_group_id(0) * TILE_N;
    const INDEX_T m0 = (INDEX_T)get_group_id(1) * TILE_M;
    const INDEX_T b = get_group_id(2);

    __local float a_tile[A_TILE_FLOATS] __attribute__((aligned(16)));
    __local float b_tile[B_TILE_FLOATS] __attribute__((aligned(16)));

    float acc[WPT_M][WPT_N];
    for (int wm = 0; wm < WPT_M; ++wm)
        for (int wn = 0; wn < WPT_N; ++wn)
            acc[wm][wn] = 0.0f;
#if ROW_SUM
    // A bias gradient is a long sum that cancels: it carries a Kahan compensation term, as the
    // generated reductions do, to stay as close to float64 as eager's cascade sum.
    float row_sum[WPT_M], row_sum_c[WPT_M];
    for (int wm = 0; wm < WPT_M; ++wm)
        row_sum[wm] = row_sum_c[wm] = 0.0f;
#endif

    A_RAW_T a_next[LOADS_A];
    B_RAW_T b_next[LOADS_B];
    FETCH_STEP(0)

    for (INDEX_T k0 = 0; k0 < SIZE_K; k0 += TILE_K) {
        STORE_TILES
        barrier(CLK_LOCAL_MEM_FENCE);
        const INDEX_T k1 = k0 + TILE_K;
        FETCH_STEP(k1)
        MULTIPLY_TILES
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int wm = 0; wm < WPT_M; ++wm) {
        const INDEX_T m = m0 + ROW_OF(tm, wm);
        for (int wn = 0; wn < WPT_N; ++wn) {
            const INDEX_T n = n0 + COL_OF(tn, wn);
            if (m < SIZE_M && n < SIZE_N)
                STORE_C(b, m, n, acc[wm][wn]);
        }
    }
#if ROW_SUM
    // The fused reduction of A over k: the first column of work-items of the first block stores it.
    if (get_group_id(0) == 0 && tn == 0) {
        for (int wm = 0; wm < WPT_M; ++wm) {
            const INDEX_T m = m0 + ROW_OF(tm, wm);
            if (m < SIZE_M)
                STORE_ROW(b, m, row_sum[wm]);
        }
    }
#endif
}

#undef K_STEP
#undef THREADS_M
#undef THREADS_N
#undef THREADS
#undef PITCH_M
#undef PITCH_N
#undef LOADS_A
#undef A_TILE_FLOATS
#undef B_TILE_FLOATS
#undef FETCH_STEP
#undef STORE_TILES
#undef ADD_ROW_SUMS
#undef MULTIPLY_TILES
#undef UNROLL_K_STEP
#undef UNROLL_PRAGMA
#undef PRAGMA_TEXT
#undef LOADS_B
#undef ROW_OF
#undef COL_OF
#undef READ_A
#undef READ_B
#undef A_KK
#undef A_MM
#undef B_KK
#undef B_NN
#undef A_FAST
#undef A_SLOW
#undef B_FAST
#undef B_SLOW
#undef A_FAST_EXTENT
#undef B_FAST_EXTENT
