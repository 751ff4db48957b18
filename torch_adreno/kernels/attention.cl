// Fused attention template (flash attention): softmax(Q K^T * SCALE [causal]) V without the
// queries x keys scores in global memory, forward and backward.
//
// Build options (-D): ATTENTION_PASS (1: forward, writes O and the row log-sum-exp; 2: dQ; 3: dK
// and dV), HEAD_DIM, SEQ_Q, SEQ_K, HEADS (query heads), GROUP (query heads per key/value head:
// grouped-query attention reads key/value head h / GROUP in place), CAUSAL (1: query i sees keys
// 0..i, PyTorch's top-left alignment), SCALE (a float literal), ROWS (work-items per group, one
// row each: queries in passes 1 and 2, keys in pass 3), TILE (rows of the other operand staged in
// local memory per step), CHUNK (keys whose scores the forward takes before rescaling its
// accumulator once; divides TILE).
//
// The code writer prepends INDEX_T, the record macros and the operand helpers behind LOAD_Q,
// LOAD_K, LOAD_V, LOAD_DO (b, head, row, d), LOAD_LSE, LOAD_DELTA (b, head, row) and the stores
// STORE_O, STORE_DQ, STORE_DK, STORE_DV (b, head, row, d, value), STORE_LSE (b, head, row, value):
// operands are index maps (a [batch, seq, heads, d] tensor read as [batch, heads, seq, d] in place),
// 16-bit storage is widened on load and rounded on store; everything computes in float32.
//
// Layout of the work: the rows a work-item owns (its query, or its key and value) live in local
// memory with a pitch of HEAD_DIM + 1 floats (neighbouring work-items read neighbouring banks;
// the forward holds its query row in registers instead);
// the other operand streams through local memory in tiles of TILE rows that every work-item reads
// at the same address (a broadcast); accumulators (O, dQ, dK, dV rows) are registers. Nothing
// relies on subgroup operations. Softmax is online (running maximum and sum): the backward
// recomputes each probability as exp(score - LSE) and uses DELTA = rowsum(dO * O) (computed by a
// reduction kernel before it) for the softmax gradient.

#define PITCH (HEAD_DIM + 1)
#define KV_HEADS (HEADS / GROUP)

#if ATTENTION_PASS == 1
__kernel __attribute__((reqd_work_group_size(ROWS, 1, 1)))
void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    const int t = get_local_id(0);
    const INDEX_T q0 = (INDEX_T)get_group_id(0) * ROWS;
    const INDEX_T bh = get_group_id(1);
    const INDEX_T b = bh / HEADS, h = bh % HEADS, kvh = h / GROUP;
    const INDEX_T i = q0 + t;
    __local float k_tile[TILE * HEAD_DIM] __attribute__((aligned(16)));
    __local float v_tile[TILE * HEAD_DIM] __attribute__((aligned(16)));
    // The forward keeps its query row in registers (read once), so that each multiply-add of the
    // scores reads local memory once (the broadcast key), and its K/V tiles get all of it.
    float q[HEAD_DIM];
    for (int d = 0; d < HEAD_DIM; ++d)
        q[d] = i < SEQ_Q ? LOAD_Q(b, h, i, d) : 0.0f;
    float acc[HEAD_DIM];
    for (int d = 0; d < HEAD_DIM; ++d)
        acc[d] = 0.0f;
    float running_max = -INFINITY, running_sum = 0.0f;
    // Causal: no query of this block sees a key past its last query.
    const INDEX_T key_end = CAUSAL ? min((INDEX_T)SEQ_K, q0 + ROWS) : (INDEX_T)SEQ_K;
    for (INDEX_T k0 = 0; k0 < key_end; k0 += TILE) {
        barrier(CLK_LOCAL_MEM_FENCE);  // (the previous tile is consumed)
        for (int e = t; e < TILE * HEAD_DIM; e += ROWS) {
            const INDEX_T key = k0 + e / HEAD_DIM;
            const int d = e % HEAD_DIM;
            k_tile[e] = key < SEQ_K ? LOAD_K(b, kvh, key, d) : 0.0f;
            v_tile[e] = key < SEQ_K ? LOAD_V(b, kvh, key, d) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const int keys = (int)min((INDEX_T)TILE, key_end - k0);
        for (int c = 0; c < keys; c += CHUNK) {
            float s[CHUNK];
            float chunk_max = -INFINITY;
            for (int u = 0; u < CHUNK; ++u) {
                __local const float *k = k_tile + (c + u) * HEAD_DIM;
                float dot = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d)
                    dot = fma(q[d], k[d], dot);
                const bool visible = c + u < keys && (!CAUSAL || k0 + c + u <= i);
                s[u] = visible ? dot * SCALE : -INFINITY;
                chunk_max = fmax(chunk_max, s[u]);
            }
            if (chunk_max == -INFINITY)
                continue;  // (a causal row past its last key)
            const float new_max = fmax(running_max, chunk_max);
            const float correction = exp(running_max - new_max);
            running_sum *= correction;
            for (int d = 0; d < HEAD_DIM; ++d)
                acc[d] *= correction;
            for (int u = 0; u < CHUNK; ++u) {
                const float p = exp(s[u] - new_max);
                running_sum += p;
                __local const float *v = v_tile + (c + u) * HEAD_DIM;
                for (int d = 0; d < HEAD_DIM; ++d)
                    acc[d] = fma(p, v[d], acc[d]);
            }
            running_max = new_max;
        }
    }
    if (i < SEQ_Q) {
        const float inverse = 1.0f / running_sum;
        for (int d = 0; d < HEAD_DIM; ++d)
            STORE_O(b, h, i, d, acc[d] * inverse);
        STORE_LSE(b, h, i, running_max + log(running_sum));
    }
}
#endif

#if ATTENTION_PASS == 2
__kernel __attribute__((reqd_work_group_size(ROWS, 1, 1)))
void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    const int t = get_local_id(0);
    const INDEX_T q0 = (INDEX_T)get_group_id(0) * ROWS;
    const INDEX_T bh = get_group_id(1);
    const INDEX_T b = bh / HEADS, h = bh % HEADS, kvh = h / GROUP;
    const INDEX_T i = q0 + t;
    __local float q_rows[ROWS * PITCH];
    __local float do_rows[ROWS * PITCH];
    __local float k_tile[TILE * HEAD_DIM] __attribute__((aligned(16)));
    __local float v_tile[TILE * HEAD_DIM] __attribute__((aligned(16)));
    for (int e = t; e < ROWS * HEAD_DIM; e += ROWS) {
        const int r = e / HEAD_DIM, d = e % HEAD_DIM;
        const bool row = q0 + r < SEQ_Q;
        q_rows[r * PITCH + d] = row ? LOAD_Q(b, h, q0 + r, d) : 0.0f;
        do_rows[r * PITCH + d] = row ? LOAD_DO(b, h, q0 + r, d) : 0.0f;
    }
    // (The row statistics go through local memory too: read into private values before the
    // barriers below, Intel's CPU compiler gave some work-items zeros.)
    __local float lse_rows[ROWS], delta_rows[ROWS];
    lse_rows[t] = i < SEQ_Q ? LOAD_LSE(b, h, i) : 0.0f;
    delta_rows[t] = i < SEQ_Q ? LOAD_DELTA(b, h, i) : 0.0f;
    __local const float *q = q_rows + t * PITCH;
    __local const float *dout = do_rows + t * PITCH;
    float dq[HEAD_DIM];
    for (int d = 0; d < HEAD_DIM; ++d)
        dq[d] = 0.0f;
    const INDEX_T key_end = CAUSAL ? min((INDEX_T)SEQ_K, q0 + ROWS) : (INDEX_T)SEQ_K;
    for (INDEX_T k0 = 0; k0 < key_end; k0 += TILE) {
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = t; e < TILE * HEAD_DIM; e += ROWS) {
            const INDEX_T key = k0 + e / HEAD_DIM;
            const int d = e % HEAD_DIM;
            k_tile[e] = key < SEQ_K ? LOAD_K(b, kvh, key, d) : 0.0f;
            v_tile[e] = key < SEQ_K ? LOAD_V(b, kvh, key, d) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const int keys = (int)min((INDEX_T)TILE, key_end - k0);
        for (int j = 0; j < keys; ++j) {
            if (i >= SEQ_Q || (CAUSAL && k0 + j > i))
                continue;
            __local const float *k = k_tile + j * HEAD_DIM;
            __local const float *v = v_tile + j * HEAD_DIM;
            float score = 0.0f, dp = 0.0f;
            for (int d = 0; d < HEAD_DIM; ++d) {
                score = fma(q[d], k[d], score);
                dp = fma(dout[d], v[d], dp);
            }
            const float ds = exp(score * SCALE - lse_rows[t]) * (dp - delta_rows[t]);
            for (int d = 0; d < HEAD_DIM; ++d)
                dq[d] = fma(ds, k[d], dq[d]);
        }
    }
    if (i < SEQ_Q)
        for (int d = 0; d < HEAD_DIM; ++d)
            STORE_DQ(b, h, i, d, dq[d] * SCALE);
}
#endif

#if ATTENTION_PASS == 3
__kernel __attribute__((reqd_work_group_size(ROWS, 1, 1)))
void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    const int t = get_local_id(0);
    const INDEX_T j0 = (INDEX_T)get_group_id(0) * ROWS;
    const INDEX_T bkv = get_group_id(1);
    const INDEX_T b = bkv / KV_HEADS, kvh = bkv % KV_HEADS;
    const INDEX_T j = j0 + t;
    __local float k_rows[ROWS * PITCH];
    __local float v_rows[ROWS * PITCH];
    __local float q_tile[TILE * HEAD_DIM] __attribute__((aligned(16)));
    __local float do_tile[TILE * HEAD_DIM] __attribute__((aligned(16)));
    __local float lse_tile[TILE];
    __local float delta_tile[TILE];
    for (int e = t; e < ROWS * HEAD_DIM; e += ROWS) {
        const int r = e / HEAD_DIM, d = e % HEAD_DIM;
        const bool row = j0 + r < SEQ_K;
        k_rows[r * PITCH + d] = row ? LOAD_K(b, kvh, j0 + r, d) : 0.0f;
        v_rows[r * PITCH + d] = row ? LOAD_V(b, kvh, j0 + r, d) : 0.0f;
    }
    __local const float *k = k_rows + t * PITCH;
    __local const float *v = v_rows + t * PITCH;
    float dk[HEAD_DIM], dv[HEAD_DIM];
    for (int d = 0; d < HEAD_DIM; ++d)
        dk[d] = dv[d] = 0.0f;
    // Causal: the queries before this block's first key see none of its keys.
    const INDEX_T query_start = CAUSAL ? min(j0, (INDEX_T)SEQ_Q) : 0;
    // The query heads sharing this key/value head each add their share (grouped-query attention).
    for (int g = 0; g < GROUP; ++g) {
        const INDEX_T h = kvh * GROUP + g;
        for (INDEX_T i0 = query_start; i0 < SEQ_Q; i0 += TILE) {
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int e = t; e < TILE * HEAD_DIM; e += ROWS) {
                const INDEX_T query = i0 + e / HEAD_DIM;
                const int d = e % HEAD_DIM;
                q_tile[e] = query < SEQ_Q ? LOAD_Q(b, h, query, d) : 0.0f;
                do_tile[e] = query < SEQ_Q ? LOAD_DO(b, h, query, d) : 0.0f;
            }
            for (int r = t; r < TILE; r += ROWS) {
                lse_tile[r] = i0 + r < SEQ_Q ? LOAD_LSE(b, h, i0 + r) : 0.0f;
                delta_tile[r] = i0 + r < SEQ_Q ? LOAD_DELTA(b, h, i0 + r) : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            const int queries = (int)min((INDEX_T)TILE, (INDEX_T)SEQ_Q - i0);
            for (int u = 0; u < queries; ++u) {
                if (j >= SEQ_K || (CAUSAL && j > i0 + u))
                    continue;
                __local const float *q = q_tile + u * HEAD_DIM;
                __local const float *dout = do_tile + u * HEAD_DIM;
                float score = 0.0f, dp = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d) {
                    score = fma(q[d], k[d], score);
                    dp = fma(dout[d], v[d], dp);
                }
                const float p = exp(score * SCALE - lse_tile[u]);
                const float ds = p * (dp - delta_tile[u]);
                for (int d = 0; d < HEAD_DIM; ++d) {
                    dv[d] = fma(p, dout[d], dv[d]);
                    dk[d] = fma(ds, q[d], dk[d]);
                }
            }
        }
    }
    if (j < SEQ_K)
        for (int d = 0; d < HEAD_DIM; ++d) {
            STORE_DK(b, kvh, j, d, dk[d] * SCALE);
            STORE_DV(b, kvh, j, d, dv[d]);
        }
}
#endif

#undef PITCH
#undef KV_HEADS
