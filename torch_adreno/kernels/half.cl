// 16-bit floats in float32 registers. Kernels compute on float values; buffers of float16 are
// read and written with vload_half / vstore_half_rte and bfloat16 buffers hold the upper 16 bits
// of a float. A value of a 16-bit type is rounded to it (nearest, ties to even) where it is
// formed, as eager PyTorch rounds each op's result, so fused kernels round where eager does.

#ifndef ADRENO_HALF_CL
#define ADRENO_HALF_CL

// x rounded to the nearest float16 value (overflow to infinity, NaN kept). A private 16-bit slot
// lets the core vstore_half_rte/vload_half pair do it: the half type itself needs cl_khr_fp16.
inline float adreno_round_half(float x) {
    ushort slot;
    vstore_half_rte(x, 0, (__private half *)&slot);
    return vload_half(0, (__private const half *)&slot);
}

inline float adreno_bf16_load(ushort bits) {
    return as_float((uint)bits << 16);
}

// The bfloat16 nearest to x (ties to even), as its bits; NaN becomes the canonical quiet NaN,
// as PyTorch's conversion makes it.
inline ushort adreno_bf16_bits(float x) {
    const uint u = as_uint(x);
    if (isnan(x))
        return (ushort)0x7FC0;
    return (ushort)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float adreno_round_bf16(float x) {
    return adreno_bf16_load(adreno_bf16_bits(x));
}
#endif
