// c[m, n] <- a[m, k] @ b[k, n], 16x16 output tiles staged through shared memory.
// Tiles past the edges of a and b load zeros, so any m, n and k (the K tail included) work.
#define TILE 16

extern "C" __global__ void matmul(const float* __restrict__ a, const float* __restrict__ b,
                                  float* __restrict__ c, int m, int n, int k) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE + 1];  // +1 keeps the column reads free of bank conflicts
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TILE) {
        int ak = k0 + threadIdx.x;
        int bk = k0 + threadIdx.y;
        as[threadIdx.y][threadIdx.x] = (row < m && ak < k) ? a[(long long)row * k + ak] : 0.0f;
        bs[threadIdx.y][threadIdx.x] = (bk < k && col < n) ? b[(long long)bk * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TILE; ++i) {
            acc = fmaf(as[threadIdx.y][i], bs[i][threadIdx.x], acc);
        }
        __syncthreads();
    }
    if (row < m && col < n) {
        c[(long long)row * n + col] = acc;
    }
}
