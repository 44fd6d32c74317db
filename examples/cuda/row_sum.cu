// out[r] <- sum of row r of x[m, n]: one block of 256 threads per row, each thread sums a
// strided slice, then a shared-memory tree combines the 256 partial sums.
#define THREADS 256

extern "C" __global__ void row_sum(const float* __restrict__ x, float* __restrict__ out, int m,
                                   int n) {
    __shared__ float partial[THREADS];
    int row = blockIdx.x;
    const float* xs = x + (long long)row * n;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < n; c += THREADS) {
        acc += xs[c];
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            partial[threadIdx.x] += partial[threadIdx.x + stride];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && row < m) {
        out[row] = partial[0];
    }
}
