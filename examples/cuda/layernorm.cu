// Layer norm over the rows of x[m, n]: out = (x - mean) / sqrt(var + eps) * gamma + beta.
// One block of 256 threads per row; the variance is a second pass over (x - mean)^2,
// which stays accurate where E[x^2] - mean^2 would cancel.
#define THREADS 256

__device__ float block_sum(float value, float* scratch) {
    scratch[threadIdx.x] = value;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            scratch[threadIdx.x] += scratch[threadIdx.x + stride];
        }
        __syncthreads();
    }
    float result = scratch[0];
    __syncthreads();
    return result;
}

extern "C" __global__ void layernorm(const float* __restrict__ x,
                                     const float* __restrict__ gamma,
                                     const float* __restrict__ beta, float* __restrict__ out,
                                     float eps, int m, int n) {
    __shared__ float scratch[THREADS];
    int row = blockIdx.x;
    if (row >= m) {
        return;
    }
    const float* xs = x + (long long)row * n;
    float* os = out + (long long)row * n;
    float local = 0.0f;
    for (int c = threadIdx.x; c < n; c += THREADS) {
        local += xs[c];
    }
    float mean = block_sum(local, scratch) / n;
    local = 0.0f;
    for (int c = threadIdx.x; c < n; c += THREADS) {
        float d = xs[c] - mean;
        local = fmaf(d, d, local);
    }
    float rstd = rsqrtf(block_sum(local, scratch) / n + eps);
    for (int c = threadIdx.x; c < n; c += THREADS) {
        os[c] = fmaf((xs[c] - mean) * rstd, gamma[c], beta[c]);
    }
}
