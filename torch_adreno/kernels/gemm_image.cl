// Operands read through 2D images (the texture path of GEMM and convolution templates).
//
// A buffer is seen as an RGBA image WIDTH texels wide: its flat element i is channel i % 4 of
// texel (i / 4 % WIDTH, i / 4 / WIDTH). The code writer renders a load of such a buffer as
// LOAD_IMAGE_FLOAT(image, i, WIDTH) (WIDTH a literal): a float value, for float and half channel
// images alike (read_imagef widens halves). Guarded: several kernels of one program include it.

#ifndef TORCH_ADRENO_IMAGE_OPERANDS
#define TORCH_ADRENO_IMAGE_OPERANDS

__constant sampler_t image_operand_sampler = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_NONE | CLK_FILTER_NEAREST;

inline float image_operand_channel(const float4 texel, const int channel)
{
    return channel == 0 ? texel.x : channel == 1 ? texel.y : channel == 2 ? texel.z : texel.w;
}

#define IMAGE_OPERAND_COORD(i, width) ((int2)((int)(((i) >> 2) % (width)), (int)(((i) >> 2) / (width))))
#define LOAD_IMAGE_FLOAT(image, i, width) \
    image_operand_channel(read_imagef((image), image_operand_sampler, IMAGE_OPERAND_COORD(i, width)), (int)((i) & 3))

#endif
