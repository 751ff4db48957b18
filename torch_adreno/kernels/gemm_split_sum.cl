// Second launch of a split-K GEMM: adds the SPLIT_K slice sums of each output and runs the fused
// epilogue on the total. One work-item per (b, m, n), n fastest, so reads of the slice sums and
// the epilogue's stores are coalesced.
//
// Build options (-D): SPLIT_K, BATCH, SIZE_M, SIZE_N, ROW_SUM (1: the row sums' slices follow the
// outputs' at ROW_BASE and are added and stored with STORE_ROW by the work-items of column 0).
// The code writer prepends INDEX_T, KERNEL_NAME, KERNEL_PARAMS, KERNEL_LOCALS, STORE_C and STORE_ROW (the same
// epilogue functions as the unsplit kernel) and SLICE(i), element i of the slice sums, laid out
// [b][slice][m][n] as the first launch (gemm.cl with b' = b * SPLIT_K + slice) stores them.

__kernel void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    const INDEX_T id = get_global_id(0);
    if (id >= (INDEX_T)BATCH * SIZE_M * SIZE_N)
        return;
    const INDEX_T n = id % SIZE_N;
    const INDEX_T m = (id / SIZE_N) % SIZE_M;
    const INDEX_T b = id / ((INDEX_T)SIZE_N * SIZE_M);
    float total = 0.0f;
    for (int s = 0; s < SPLIT_K; ++s)
        total += SLICE(((b * SPLIT_K + s) * SIZE_M + m) * SIZE_N + n);
    STORE_C(b, m, n, total);
#if ROW_SUM
    if (n == 0) {
        float row = 0.0f;
        for (int s = 0; s < SPLIT_K; ++s)
            row += SLICE(ROW_BASE + (b * SPLIT_K + s) * SIZE_M + m);
        STORE_ROW(b, m, row);
    }
#endif
}
