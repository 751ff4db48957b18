// Fused attention template (flash attention): softmax(Q K^T * SCALE [causal]) V without the
// queries x keys scores in global memory, forward and backward, register-blocked.
//
// Build options (-D): ATTENTION_PASS (1: forward, writes O and the row log-sum-exp; 2: dQ; 3: dK
// and dV), HEAD_DIM, SEQ_Q, SEQ_K, HEADS (query heads), GROUP (query heads per key/value head:
// grouped-query attention reads key/value head h / GROUP in place), CAUSAL (1: query i sees keys
// 0..i, PyTorch's top-left alignment), SCALE (a float literal), and the blocking:
//   BLOCK_ROWS  rows a work-group owns (queries in passes 1 and 2, keys in pass 3);
//   BLOCK_COLS  rows of the other operand streamed through local memory per step;
//   MICRO_ROWS, MICRO_COLS  the score micro-tile of one work-item (registers).
// A group has (BLOCK_ROWS / MICRO_ROWS) x (BLOCK_COLS / MICRO_COLS) work-items; work-item
// (rg, cg) owns rows rg + i * ROW_GROUPS and streamed columns cg + j * COL_GROUPS (strided, so
// that the neighbours of a warp read different banks), and of each owned row's accumulators the
// head-dim columns cg * ACC_COLS .. + ACC_COLS.
//
// The code writer prepends INDEX_T, the record macros and the operand helpers behind LOAD_Q,
// LOAD_K, LOAD_V, LOAD_DO (b, head, row, d), LOAD_LSE, LOAD_DELTA (b, head, row) and the stores
// STORE_O, STORE_DQ, STORE_DK, STORE_DV (b, head, row, d, value), STORE_LSE (b, head, row, value):
// operands are index maps (a [batch, seq, heads, d] tensor read as [batch, heads, seq, d] in place),
// 16-bit storage is widened on load and rounded on store; everything computes in float32.
//
// Each step is two small matrix products per work-item: the scores (and, in the backward, dP)
// of its micro-tile from rows read as float4 (MICRO_ROWS + MICRO_COLS local reads per 4 x
// MICRO_ROWS x MICRO_COLS multiply-adds), then P (or dS) staged in local memory times the
// streamed V (or K, Q, dO) into its accumulators (MICRO_ROWS + ACC_COLS reads of 16 bytes per
// 4 x MICRO_ROWS x ACC_COLS multiply-adds). Softmax is online in the forward: the row maxima and
// sums are reduced across the COL_GROUPS work-items of a row through local memory and live there
// (not in registers across barriers: Intel's CPU compiler once gave some work-items zeros for
// private row statistics read before a barrier). The backward recomputes each probability as
// exp(score - LSE) and uses DELTA = rowsum(dO * O) (a reduction kernel before it): no reductions
// across work-items. Causal blocks past a row block's last row are skipped whole. Nothing relies
// on subgroup operations.

#define KV_HEADS (HEADS / GROUP)
#define ROW_GROUPS (BLOCK_ROWS / MICRO_ROWS)
#define COL_GROUPS (BLOCK_COLS / MICRO_COLS)
#define THREADS (ROW_GROUPS * COL_GROUPS)
#define ACC_COLS ((HEAD_DIM + COL_GROUPS - 1) / COL_GROUPS)
#if HEAD_DIM % 4 == 0
#define PITCH (HEAD_DIM + 4)  // (float4 rows; 4 banks apart)
#else
#define PITCH (HEAD_DIM + 1)
#endif
#define OWNED_ROW(i) (rg + (i) * ROW_GROUPS)
#define STREAMED_COL(j) (cg + (j) * COL_GROUPS)

// SCORES[i][j] = sum_d A[OWNED_ROW(i)][d] * B[STREAMED_COL(j)][d], A and B of pitch PITCH.
#if HEAD_DIM % 4 == 0
#define MICRO_DOT(SCORES, A, B)                                                                   \
    for (int d4 = 0; d4 < HEAD_DIM / 4; ++d4) {                                                   \
        float4 a_[MICRO_ROWS], b_[MICRO_COLS];                                                    \
        for (int i = 0; i < MICRO_ROWS; ++i)                                                      \
            a_[i] = ((__local const float4 *)((A) + OWNED_ROW(i) * PITCH))[d4];                   \
        for (int j = 0; j < MICRO_COLS; ++j)                                                      \
            b_[j] = ((__local const float4 *)((B) + STREAMED_COL(j) * PITCH))[d4];                \
        for (int i = 0; i < MICRO_ROWS; ++i)                                                      \
            for (int j = 0; j < MICRO_COLS; ++j)                                                  \
                SCORES[i][j] = fma(a_[i].w, b_[j].w, fma(a_[i].z, b_[j].z,                        \
                               fma(a_[i].y, b_[j].y, fma(a_[i].x, b_[j].x, SCORES[i][j]))));      \
    }
#else
#define MICRO_DOT(SCORES, A, B)                                                                   \
    for (int d = 0; d < HEAD_DIM; ++d) {                                                          \
        float a_[MICRO_ROWS], b_[MICRO_COLS];                                                     \
        for (int i = 0; i < MICRO_ROWS; ++i)                                                      \
            a_[i] = (A)[OWNED_ROW(i) * PITCH + d];                                                \
        for (int j = 0; j < MICRO_COLS; ++j)                                                      \
            b_[j] = (B)[STREAMED_COL(j) * PITCH + d];                                             \
        for (int i = 0; i < MICRO_ROWS; ++i)                                                      \
            for (int j = 0; j < MICRO_COLS; ++j)                                                  \
                SCORES[i][j] = fma(a_[i], b_[j], SCORES[i][j]);                                   \
    }
#endif

// ACC[i][c] += sum_j X[OWNED_ROW(i)][j] * Y[j][cg * ACC_COLS + c]: X a BLOCK_ROWS x BLOCK_COLS
// tile (P or dS), Y a streamed BLOCK_COLS x HEAD_DIM tile of pitch PITCH.
#if HEAD_DIM % (4 * COL_GROUPS) == 0 && BLOCK_COLS % 4 == 0
// (X read as float4 along j too: per 4 streamed rows MICRO_ROWS + ACC_COLS reads of 16 bytes.)
#define MICRO_ACCUMULATE(ACC, X, Y)                                                               \
    for (int j4 = 0; j4 < BLOCK_COLS / 4; ++j4) {                                                 \
        float4 x_[MICRO_ROWS];                                                                    \
        for (int i = 0; i < MICRO_ROWS; ++i)                                                      \
            x_[i] = ((__local const float4 *)((X) + OWNED_ROW(i) * BLOCK_COLS))[j4];              \
        for (int jj = 0; jj < 4; ++jj) {                                                          \
            __local const float4 *y_ =                                                            \
                (__local const float4 *)((Y) + (4 * j4 + jj) * PITCH + cg * ACC_COLS);            \
            for (int c4 = 0; c4 < ACC_COLS / 4; ++c4) {                                           \
                const float4 y4 = y_[c4];                                                         \
                for (int i = 0; i < MICRO_ROWS; ++i) {                                            \
                    const float x = jj == 0 ? x_[i].x : jj == 1 ? x_[i].y : jj == 2 ? x_[i].z : x_[i].w; \
                    ACC[i][4 * c4] = fma(x, y4.x, ACC[i][4 * c4]);                                \
                    ACC[i][4 * c4 + 1] = fma(x, y4.y, ACC[i][4 * c4 + 1]);                        \
                    ACC[i][4 * c4 + 2] = fma(x, y4.z, ACC[i][4 * c4 + 2]);                        \
                    ACC[i][4 * c4 + 3] = fma(x, y4.w, ACC[i][4 * c4 + 3]);                        \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }
#else
#define MICRO_ACCUMULATE(ACC, X, Y)                                                               \
    for (int j = 0; j < BLOCK_COLS; ++j) {                                                        \
        float x_[MICRO_ROWS];                                                                     \
        for (int i = 0; i < MICRO_ROWS; ++i)                                                      \
            x_[i] = (X)[OWNED_ROW(i) * BLOCK_COLS + j];                                           \
        for (int c = 0; c < ACC_COLS; ++c) {                                                      \
            const int d = cg * ACC_COLS + c;                                                      \
            const float y = d < HEAD_DIM ? (Y)[j * PITCH + d] : 0.0f;                             \
            for (int i = 0; i < MICRO_ROWS; ++i)                                                  \
                ACC[i][c] = fma(x_[i], y, ACC[i][c]);                                             \
        }                                                                                         \
    }
#endif

#define ZERO2(ARRAY, N, M)                                                                        \
    for (int i = 0; i < (N); ++i)                                                                 \
        for (int j = 0; j < (M); ++j)                                                             \
            ARRAY[i][j] = 0.0f;

// Rows first..first + N of a [.., rows, d] operand into a local tile of pitch PITCH, zeros past END.
#define STAGE_ROWS(TILE, N, LOAD, HEAD, FIRST, END)                                               \
    for (int e = t; e < (N) * HEAD_DIM; e += THREADS) {                                           \
        const int r_ = e / HEAD_DIM, d_ = e % HEAD_DIM;                                           \
        const INDEX_T row_ = (FIRST) + r_;                                                        \
        TILE[r_ * PITCH + d_] = row_ < (END) ? LOAD(b, HEAD, row_, d_) : 0.0f;                    \
    }

// A query-block pass's ids: work-item t (row group rg, column group cg), the block's first query
// q0, batch b, query head h and the key/value head kvh it reads.
#define QUERY_BLOCK_IDS                                                                           \
    const int t = get_local_id(0);                                                                \
    const int rg = t / COL_GROUPS, cg = t % COL_GROUPS;                                           \
    const INDEX_T q0 = (INDEX_T)get_group_id(0) * BLOCK_ROWS;                                     \
    const INDEX_T bh = get_group_id(1);                                                           \
    const INDEX_T b = bh / HEADS, h = bh % HEADS, kvh = h / GROUP;

#if ATTENTION_PASS == 1
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    QUERY_BLOCK_IDS
    __local float q_rows[BLOCK_ROWS * PITCH] __attribute__((aligned(16)));
    // The key tile, then (once the scores are taken) the probabilities P: one buffer.
#define KP_FLOATS (BLOCK_COLS * PITCH > BLOCK_ROWS * BLOCK_COLS ? BLOCK_COLS * PITCH : BLOCK_ROWS * BLOCK_COLS)
    __local float kp_tile[KP_FLOATS] __attribute__((aligned(16)));
#undef KP_FLOATS
    __local float v_tile[BLOCK_COLS * PITCH] __attribute__((aligned(16)));
    __local float partial_max[BLOCK_ROWS * COL_GROUPS], partial_sum[BLOCK_ROWS * COL_GROUPS];
    __local float row_max[BLOCK_ROWS], row_sum[BLOCK_ROWS];
    STAGE_ROWS(q_rows, BLOCK_ROWS, LOAD_Q, h, q0, SEQ_Q)
    for (int r = t; r < BLOCK_ROWS; r += THREADS) {
        row_max[r] = -INFINITY;
        row_sum[r] = 0.0f;
    }
    float acc[MICRO_ROWS][ACC_COLS];
    ZERO2(acc, MICRO_ROWS, ACC_COLS)
    // Causal: no query of this block sees a key past its last query.
    const INDEX_T key_end = CAUSAL ? min((INDEX_T)SEQ_K, q0 + BLOCK_ROWS) : (INDEX_T)SEQ_K;
    for (INDEX_T k0 = 0; k0 < key_end; k0 += BLOCK_COLS) {
        barrier(CLK_LOCAL_MEM_FENCE);  // (the previous P and V are consumed)
        STAGE_ROWS(kp_tile, BLOCK_COLS, LOAD_K, kvh, k0, SEQ_K)
        STAGE_ROWS(v_tile, BLOCK_COLS, LOAD_V, kvh, k0, SEQ_K)
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[MICRO_ROWS][MICRO_COLS];
        ZERO2(s, MICRO_ROWS, MICRO_COLS)
        MICRO_DOT(s, q_rows, kp_tile)
        for (int i = 0; i < MICRO_ROWS; ++i) {
            float m = -INFINITY;
            for (int j = 0; j < MICRO_COLS; ++j) {
                const INDEX_T key = k0 + STREAMED_COL(j);
                const bool visible = key < SEQ_K && (!CAUSAL || key <= q0 + OWNED_ROW(i));
                s[i][j] = visible ? s[i][j] * SCALE : -INFINITY;
                m = fmax(m, s[i][j]);
            }
            partial_max[OWNED_ROW(i) * COL_GROUPS + cg] = m;
        }
        barrier(CLK_LOCAL_MEM_FENCE);  // (the maxima are written; the key tile is read)
        for (int i = 0; i < MICRO_ROWS; ++i) {
            const int r = OWNED_ROW(i);
            float new_max = row_max[r];
            for (int g = 0; g < COL_GROUPS; ++g)
                new_max = fmax(new_max, partial_max[r * COL_GROUPS + g]);
            // (A row that has seen no key yet keeps a zero accumulator: no -inf - -inf.)
            const float base = new_max == -INFINITY ? 0.0f : new_max;
            const float correction = exp(row_max[r] - base);
            float sum = 0.0f;
            for (int j = 0; j < MICRO_COLS; ++j) {
                const float p = exp(s[i][j] - base);
                kp_tile[r * BLOCK_COLS + STREAMED_COL(j)] = p;
                sum += p;
            }
            partial_sum[r * COL_GROUPS + cg] = sum;
            for (int c = 0; c < ACC_COLS; ++c)
                acc[i][c] *= correction;
        }
        barrier(CLK_LOCAL_MEM_FENCE);  // (P and the sums are written; row_max is read)
        if (cg == 0)
            for (int i = 0; i < MICRO_ROWS; ++i) {
                const int r = OWNED_ROW(i);
                float new_max = row_max[r], sum = 0.0f;
                for (int g = 0; g < COL_GROUPS; ++g) {
                    new_max = fmax(new_max, partial_max[r * COL_GROUPS + g]);
                    sum += partial_sum[r * COL_GROUPS + g];
                }
                const float base = new_max == -INFINITY ? 0.0f : new_max;
                row_sum[r] = row_sum[r] * exp(row_max[r] - base) + sum;
                row_max[r] = new_max;
            }
        MICRO_ACCUMULATE(acc, kp_tile, v_tile)
    }
    barrier(CLK_LOCAL_MEM_FENCE);  // (the last row statistics are written)
    for (int i = 0; i < MICRO_ROWS; ++i) {
        const INDEX_T query = q0 + OWNED_ROW(i);
        if (query >= SEQ_Q)
            continue;
        const float total = row_sum[OWNED_ROW(i)];
        const float inverse = 1.0f / total;
        for (int c = 0; c < ACC_COLS; ++c) {
            const int d = cg * ACC_COLS + c;
            if (d < HEAD_DIM)
                STORE_O(b, h, query, d, acc[i][c] * inverse);
        }
        if (cg == 0)
            STORE_LSE(b, h, query, row_max[OWNED_ROW(i)] + log(total));
    }
}
#endif

#if ATTENTION_PASS == 2
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    QUERY_BLOCK_IDS
    __local float q_rows[BLOCK_ROWS * PITCH] __attribute__((aligned(16)));
    __local float do_rows[BLOCK_ROWS * PITCH] __attribute__((aligned(16)));
    __local float k_tile[BLOCK_COLS * PITCH] __attribute__((aligned(16)));
    __local float v_tile[BLOCK_COLS * PITCH] __attribute__((aligned(16)));
    __local float ds_tile[BLOCK_ROWS * BLOCK_COLS] __attribute__((aligned(16)));
    __local float lse_rows[BLOCK_ROWS], delta_rows[BLOCK_ROWS];
    STAGE_ROWS(q_rows, BLOCK_ROWS, LOAD_Q, h, q0, SEQ_Q)
    STAGE_ROWS(do_rows, BLOCK_ROWS, LOAD_DO, h, q0, SEQ_Q)
    for (int r = t; r < BLOCK_ROWS; r += THREADS) {
        lse_rows[r] = q0 + r < SEQ_Q ? LOAD_LSE(b, h, q0 + r) : 0.0f;
        delta_rows[r] = q0 + r < SEQ_Q ? LOAD_DELTA(b, h, q0 + r) : 0.0f;
    }
    float dq[MICRO_ROWS][ACC_COLS];
    ZERO2(dq, MICRO_ROWS, ACC_COLS)
    const INDEX_T key_end = CAUSAL ? min((INDEX_T)SEQ_K, q0 + BLOCK_ROWS) : (INDEX_T)SEQ_K;
    for (INDEX_T k0 = 0; k0 < key_end; k0 += BLOCK_COLS) {
        barrier(CLK_LOCAL_MEM_FENCE);  // (the previous dS and K are consumed)
        STAGE_ROWS(k_tile, BLOCK_COLS, LOAD_K, kvh, k0, SEQ_K)
        STAGE_ROWS(v_tile, BLOCK_COLS, LOAD_V, kvh, k0, SEQ_K)
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[MICRO_ROWS][MICRO_COLS], dp[MICRO_ROWS][MICRO_COLS];
        ZERO2(s, MICRO_ROWS, MICRO_COLS)
        ZERO2(dp, MICRO_ROWS, MICRO_COLS)
        MICRO_DOT(s, q_rows, k_tile)
        MICRO_DOT(dp, do_rows, v_tile)
        for (int i = 0; i < MICRO_ROWS; ++i) {
            const int r = OWNED_ROW(i);
            for (int j = 0; j < MICRO_COLS; ++j) {
                const INDEX_T key = k0 + STREAMED_COL(j);
                const bool visible = q0 + r < SEQ_Q && key < SEQ_K && (!CAUSAL || key <= q0 + r);
                ds_tile[r * BLOCK_COLS + STREAMED_COL(j)] =
                    visible ? exp(s[i][j] * SCALE - lse_rows[r]) * (dp[i][j] - delta_rows[r]) : 0.0f;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        MICRO_ACCUMULATE(dq, ds_tile, k_tile)
    }
    for (int i = 0; i < MICRO_ROWS; ++i) {
        const INDEX_T query = q0 + OWNED_ROW(i);
        for (int c = 0; c < ACC_COLS; ++c) {
            const int d = cg * ACC_COLS + c;
            if (query < SEQ_Q && d < HEAD_DIM)
                STORE_DQ(b, h, query, d, dq[i][c] * SCALE);
        }
    }
}
#endif

#if ATTENTION_PASS == 3
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void KERNEL_NAME(KERNEL_PARAMS)
{
    KERNEL_LOCALS
    const int t = get_local_id(0);
    const int rg = t / COL_GROUPS, cg = t % COL_GROUPS;
    const INDEX_T j0 = (INDEX_T)get_group_id(0) * BLOCK_ROWS;
    const INDEX_T bkv = get_group_id(1);
    const INDEX_T b = bkv / KV_HEADS, kvh = bkv % KV_HEADS;
    __local float k_rows[BLOCK_ROWS * PITCH] __attribute__((aligned(16)));
    __local float v_rows[BLOCK_ROWS * PITCH] __attribute__((aligned(16)));
    __local float q_tile[BLOCK_COLS * PITCH] __attribute__((aligned(16)));
    __local float do_tile[BLOCK_COLS * PITCH] __attribute__((aligned(16)));
    __local float p_tile[BLOCK_ROWS * BLOCK_COLS] __attribute__((aligned(16)));
    __local float ds_tile[BLOCK_ROWS * BLOCK_COLS] __attribute__((aligned(16)));
    __local float lse_tile[BLOCK_COLS], delta_tile[BLOCK_COLS];
    STAGE_ROWS(k_rows, BLOCK_ROWS, LOAD_K, kvh, j0, SEQ_K)
    STAGE_ROWS(v_rows, BLOCK_ROWS, LOAD_V, kvh, j0, SEQ_K)
    float dk[MICRO_ROWS][ACC_COLS], dv[MICRO_ROWS][ACC_COLS];
    ZERO2(dk, MICRO_ROWS, ACC_COLS)
    ZERO2(dv, MICRO_ROWS, ACC_COLS)
    // Causal: the queries before this block's first key see none of its keys.
    const INDEX_T query_start = CAUSAL ? min(j0, (INDEX_T)SEQ_Q) : 0;
    // The query heads sharing this key/value head each add their share (grouped-query attention).
    for (int g = 0; g < GROUP; ++g) {
        const INDEX_T h = kvh * GROUP + g;
        for (INDEX_T i0 = query_start; i0 < SEQ_Q; i0 += BLOCK_COLS) {
            barrier(CLK_LOCAL_MEM_FENCE);  // (the previous P, dS, Q and dO are consumed)
            STAGE_ROWS(q_tile, BLOCK_COLS, LOAD_Q, h, i0, SEQ_Q)
            STAGE_ROWS(do_tile, BLOCK_COLS, LOAD_DO, h, i0, SEQ_Q)
            for (int c = t; c < BLOCK_COLS; c += THREADS) {
                lse_tile[c] = i0 + c < SEQ_Q ? LOAD_LSE(b, h, i0 + c) : 0.0f;
                delta_tile[c] = i0 + c < SEQ_Q ? LOAD_DELTA(b, h, i0 + c) : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            float s[MICRO_ROWS][MICRO_COLS], dp[MICRO_ROWS][MICRO_COLS];
            ZERO2(s, MICRO_ROWS, MICRO_COLS)
            ZERO2(dp, MICRO_ROWS, MICRO_COLS)
            MICRO_DOT(s, k_rows, q_tile)    // (S transposed: keys x queries)
            MICRO_DOT(dp, v_rows, do_tile)
            for (int i = 0; i < MICRO_ROWS; ++i) {
                const int r = OWNED_ROW(i);
                for (int j = 0; j < MICRO_COLS; ++j) {
                    const int c = STREAMED_COL(j);
                    const bool visible = j0 + r < SEQ_K && i0 + c < SEQ_Q && (!CAUSAL || j0 + r <= i0 + c);
                    const float p = visible ? exp(s[i][j] * SCALE - lse_tile[c]) : 0.0f;
                    p_tile[r * BLOCK_COLS + c] = p;
                    ds_tile[r * BLOCK_COLS + c] = p * (dp[i][j] - delta_tile[c]);
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            MICRO_ACCUMULATE(dv, p_tile, do_tile)
            MICRO_ACCUMULATE(dk, ds_tile, q_tile)
        }
    }
    for (int i = 0; i < MICRO_ROWS; ++i) {
        const INDEX_T key = j0 + OWNED_ROW(i);
        for (int c = 0; c < ACC_COLS; ++c) {
            const int d = cg * ACC_COLS + c;
            if (key < SEQ_K && d < HEAD_DIM) {
                STORE_DK(b, kvh, key, d, dk[i][c] * SCALE);
                STORE_DV(b, kvh, key, d, dv[i][c]);
            }
        }
    }
}
#endif

#undef KV_HEADS
#undef ROW_GROUPS
#undef COL_GROUPS
#undef THREADS
#undef ACC_COLS
#undef PITCH
#undef OWNED_ROW
#undef STREAMED_COL
#undef MICRO_DOT
#undef MICRO_ACCUMULATE
#undef ZERO2
#undef STAGE_ROWS
#undef QUERY_BLOCK_IDS
