// out[r] <- max of row r of x[m, n], one warp per row: each lane takes a strided slice,
// then __shfl_down_sync folds the 32 lane maxima without shared memory.
#define WARP 32
#define WARPS_PER_BLOCK 4

extern "C" __global__ void row_max(const float* __restrict__ x, float* __restrict__ out, int m,
                                   int n) {
    int lane = threadIdx.x % WARP;
    int row = blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP;
    // The whole warp leaves together, so every shuffle below has all 32 lanes present.
    if (row >= m) {
        return;
    }
    const float* xs = x + (long long)row * n;
    float best = -__int_as_float(0x7f800000);  // -inf: NVRTC has no <math.h> INFINITY
    for (int c = lane; c < n; c += WARP) {
        best = fmaxf(best, xs[c]);
    }
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset >>= 1) {
        best = fmaxf(best, __shfl_down_sync(0xffffffffu, best, offset));
    }
    if (lane == 0) {
        out[row] = best;
    }
}
