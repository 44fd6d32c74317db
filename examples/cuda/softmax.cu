// Row softmax of x[m, n], max-subtracted so that large inputs do not overflow expf.
// One block of 256 threads per row: a max reduction, a sum reduction, then the write.
#define THREADS 256

__device__ float block_reduce(float value, float* scratch, bool take_max) {
    scratch[threadIdx.x] = value;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            float other = scratch[threadIdx.x + stride];
            float mine = scratch[threadIdx.x];
            scratch[threadIdx.x] = take_max ? fmaxf(mine, other) : mine + other;
        }
        __syncthreads();
    }
    float result = scratch[0];
    // Everyone must read the result before the scratch is reused by the next reduction.
    __syncthreads();
    return result;
}

extern "C" __global__ void softmax(const float* __restrict__ x, float* __restrict__ out, int m,
                                   int n) {
    __shared__ float scratch[THREADS];
    int row = blockIdx.x;
    if (row >= m) {
        return;
    }
    const float* xs = x + (long long)row * n;
    float* os = out + (long long)row * n;
    float local_max = -__int_as_float(0x7f800000);  // -inf: NVRTC has no <math.h> INFINITY
    for (int c = threadIdx.x; c < n; c += THREADS) {
        local_max = fmaxf(local_max, xs[c]);
    }
    float row_max = block_reduce(local_max, scratch, true);
    float local_sum = 0.0f;
    for (int c = threadIdx.x; c < n; c += THREADS) {
        local_sum += expf(xs[c] - row_max);
    }
    float inv_sum = 1.0f / block_reduce(local_sum, scratch, false);
    for (int c = threadIdx.x; c < n; c += THREADS) {
        os[c] = expf(xs[c] - row_max) * inv_sum;
    }
}
