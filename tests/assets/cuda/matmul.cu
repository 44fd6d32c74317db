// Tiled shared-memory matmul: correct, and one that drops the K tail.

#define TILE 16

// Correct: c = a @ b; every tile edge is guarded, K included.
extern "C" __global__ void matmul(const float* a, const float* b, float* c, int M, int N, int K) {
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        ta[threadIdx.y][threadIdx.x] = row < M && ka < K ? a[(long long)row * K + ka] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = kb < K && col < N ? b[(long long)kb * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) c[(long long)row * N + col] = acc;
}

// correctness: the K loop runs K / TILE whole tiles and drops the K % TILE tail.
extern "C" __global__ void matmul_drops_k_tail(const float* a, const float* b, float* c, int M,
                                               int N, int K) {
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < K / TILE; ++t) {
        int ka = t * TILE + threadIdx.x, kb = t * TILE + threadIdx.y;
        ta[threadIdx.y][threadIdx.x] = row < M ? a[(long long)row * K + ka] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = col < N ? b[(long long)kb * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) c[(long long)row * N + col] = acc;
}
