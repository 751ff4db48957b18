// Second launch of a stream-K GEMM (gemm.cl with STREAM=1): each output's product from the slices
// buffer (its tile's, or the sum of its tile's STREAM_SPLIT slices) through the fused epilogue.
// One work-item per (b, m, n), n fastest, so the epilogue's stores are coalesced.
//
// Build options (-D): BATCH, SIZE_M, SIZE_N, TILE (the tiles' side), TILES_M, TILES_N,
// FULL_TILES, REMAINDER_TILES, STREAM_SPLIT. The code writer prepends INDEX_T, KERNEL_NAME,
// KERNEL_PARAMS, KERNEL_LOCALS, STORE_C (the GEMM's epilogue) and SLICE(i), element i of the
// slices buffer: [FULL_TILES tiles][STREAM_SPLIT][REMAINDER_TILES tiles], each TILE x TILE, row-major.

__kernel void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    const INDEX_T id = get_global_id(0);
    if (id >= (INDEX_T)BATCH * SIZE_M * SIZE_N)
        return;
    const INDEX_T n = id % SIZE_N;
    const INDEX_T m = (id / SIZE_N) % SIZE_M;
    const INDEX_T b = id / ((INDEX_T)SIZE_N * SIZE_M);
    const INDEX_T tile = (b * TILES_M + m / TILE) * TILES_N + n / TILE;
    const INDEX_T within = (m % TILE) * TILE + n % TILE;
    float total;
    if (tile < FULL_TILES) {
        total = SLICE(tile * (TILE * TILE) + within);
    } else {
        total = 0.0f;
        for (int s = 0; s < STREAM_SPLIT; ++s)
            total += SLICE(((INDEX_T)FULL_TILES + s * REMAINDER_TILES + (tile - FULL_TILES)) * (TILE * TILE) + within);
    }
    STORE_C(b, m, n, total);
}
