// Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC 2011), the generator of cuRAND and of PyTorch's GPU kernels. A number is a pure
// function of (seed, counter): kernels need no generator state, and a value recomputed in another
// kernel (the fusion stage may inline a random mask into several consumers) is the same value.
#ifndef ADRENO_RANDOM_CL
#define ADRENO_RANDOM_CL
inline float adreno_uniform(ulong seed, ulong counter) {
    uint c0 = (uint)counter, c1 = (uint)(counter >> 32), c2 = 0u, c3 = 0u;
    uint k0 = (uint)seed, k1 = (uint)(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        const uint lo0 = 0xD2511F53u * c0, hi0 = mul_hi(0xD2511F53u, c0);
        const uint lo1 = 0xCD9E8D57u * c2, hi1 = mul_hi(0xCD9E8D57u, c2);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    // 24 random bits: every value is exactly representable and strictly below 1.
    return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}
#endif
