// Row reductions and softmax in CUDA C: one block of 256 threads per row.

#define THREADS 256

// Round to the nearest float16 and back: float16 arithmetic without cuda_fp16.h
// (which pip's NVRTC does not ship). A sum of two float16 values is exact in float32,
// so rounding it gives exactly the float16 sum.
__device__ float to_half(float v) {
    unsigned short h;
    float r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
    return r;
}

// Correct: out[r] = sum of row r, a shared-memory tree with a barrier at each level.
extern "C" __global__ void row_sum(const float* x, float* out, int m, int n) {
    __shared__ float s[THREADS];
    int row = blockIdx.x, t = threadIdx.x;
    float acc = 0.0f;
    for (int c = t; c < n; c += THREADS) acc += x[(long long)row * n + c];
    s[t] = acc;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) out[row] = s[0];
}

// correctness: a float32 result accumulated in float16.
extern "C" __global__ void row_sum_f16_acc(const float* x, float* out, int m, int n) {
    __shared__ float s[THREADS];
    int row = blockIdx.x, t = threadIdx.x;
    float acc = 0.0f;
    for (int c = t; c < n; c += THREADS) acc = to_half(acc + to_half(x[(long long)row * n + c]));
    s[t] = acc;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] = to_half(s[t] + s[t + stride]);
        __syncthreads();
    }
    if (t == 0) out[row] = s[0];
}

// determinism or correctness: the barriers are missing, so warps read partial sums
// that other warps have not written yet (a shared-memory race).
extern "C" __global__ void row_sum_race(const float* x, float* out, int m, int n) {
    __shared__ float s[THREADS];
    int row = blockIdx.x, t = threadIdx.x;
    float acc = 0.0f;
    for (int c = t; c < n; c += THREADS) acc += x[(long long)row * n + c];
    s[t] = acc;
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
    }
    if (t == 0) out[row] = s[0];
}

// Correct: out[i] = x[i] + x[i + 1] (x[n] taken as 0), through a shared tile with a halo.
extern "C" __global__ void neighbor_sum_tiled(const float* x, float* out, int n) {
    __shared__ float tile[THREADS + 1];
    int t = threadIdx.x, i = blockIdx.x * THREADS + t;
    tile[t] = i < n ? x[i] : 0.0f;
    if (t == 0) {
        int h = blockIdx.x * THREADS + THREADS;
        tile[THREADS] = h < n ? x[h] : 0.0f;
    }
    __syncthreads();
    if (i < n) out[i] = tile[t] + tile[t + 1];
}

// correctness or determinism: the halo element tile[THREADS] is never loaded, so the
// last thread of each block reads uninitialised shared memory.
extern "C" __global__ void neighbor_sum_uninit_smem(const float* x, float* out, int n) {
    __shared__ float tile[THREADS + 1];
    int t = threadIdx.x, i = blockIdx.x * THREADS + t;
    tile[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) out[i] = tile[t] + (i + 1 < n ? tile[t + 1] : 0.0f);
}

// Correct: a row softmax that subtracts the row's max before exp.
extern "C" __global__ void softmax(const float* x, float* out, int m, int n) {
    __shared__ float s[THREADS];
    int row = blockIdx.x, t = threadIdx.x;
    const float* r = x + (long long)row * n;
    float mx = __int_as_float(0xff800000);  // -inf
    for (int c = t; c < n; c += THREADS) mx = fmaxf(mx, r[c]);
    s[t] = mx;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] = fmaxf(s[t], s[t + stride]);
        __syncthreads();
    }
    mx = s[0];
    __syncthreads();
    float sum = 0.0f;
    for (int c = t; c < n; c += THREADS) sum += expf(r[c] - mx);
    s[t] = sum;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    sum = s[0];
    for (int c = t; c < n; c += THREADS) out[(long long)row * n + c] = expf(r[c] - mx) / sum;
}

// special-values: exp(x) without subtracting the max overflows on large inputs (inf/inf).
extern "C" __global__ void softmax_no_max(const float* x, float* out, int m, int n) {
    __shared__ float s[THREADS];
    int row = blockIdx.x, t = threadIdx.x;
    const float* r = x + (long long)row * n;
    float sum = 0.0f;
    for (int c = t; c < n; c += THREADS) sum += expf(r[c]);
    s[t] = sum;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    sum = s[0];
    for (int c = t; c < n; c += THREADS) out[(long long)row * n + c] = expf(r[c]) / sum;
}
