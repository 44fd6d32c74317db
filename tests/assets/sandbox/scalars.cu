// Executor tests: every scalar must arrive with its declared width, and dynamic
// shared memory beyond 48 KiB must be granted.

extern "C" __global__ void scalars(double* out, double a, long long b, float c, int d,
                                   unsigned char e, short f) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = a;
        out[1] = (double)b;
        out[2] = (double)c;
        out[3] = (double)d;
        out[4] = (double)e;
        out[5] = (double)f;
    }
}

// Copies x to out through dynamic shared memory of shared_mem bytes.
extern "C" __global__ void big_shared_copy(const float* x, float* out, int n) {
    extern __shared__ float buffer[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buffer[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) out[i] = buffer[threadIdx.x];
}

// Reads and writes an illegal address: a sticky error.
extern "C" __global__ void illegal_address(const float* x, float* out, int n) {
    float* p = (float*)0x10;
    out[0] = *p;
}

// Copy, to check that a sandbox keeps working after another one crashed.
extern "C" __global__ void copy(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i];
}
