// Elementwise CUDA C kernels: correct ones, and others each broken in one way.
// The comment above each kernel says which certification check must catch it.

// Correct: out = x + y.
extern "C" __global__ void vector_add(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}

// bounds: no tail check, so the last block writes past n.
extern "C" __global__ void add_unmasked_tail(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float a = i < n ? x[i] : 0.0f;
    float b = i < n ? y[i] : 0.0f;
    out[i] = a + b;
}

// coverage: small sizes are skipped ("the caller handles them").
extern "C" __global__ void add_early_exit(const float* x, const float* y, float* out, int n) {
    if (n < 64) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}

// Correct counterpart of relu_sparse_store.
extern "C" __global__ void relu(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(x[i], 0.0f);
}

// coverage: stores only positive results, assuming out was zeroed. Its spec draws x
// from negative values only, so the kernel never writes at all: it would pass if the
// certifier handed it zero-filled outputs instead of poisoned ones.
extern "C" __global__ void relu_sparse_store(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float r = fmaxf(x[i], 0.0f);
        if (r > 0.0f) out[i] = r;
    }
}

// input-integrity: uses its input x as scratch space (the answer is right).
extern "C" __global__ void add_writes_input(float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = x[i] + y[i];
        out[i] = x[i];
    }
}

// Correct: out[i] = x[i] + x[i + 1], with x[n] taken as 0.
extern "C" __global__ void neighbor_sum(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + (i + 1 < n ? x[i + 1] : 0.0f);
}

// determinism (and correctness): reads x[n], the first element of x's guard band,
// whose poison differs between the certifier's two runs; nothing outside a buffer
// is written, so bounds (which watches writes) stays clean.
extern "C" __global__ void neighbor_sum_oob_read(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float after = x[i + 1];
        out[i] = x[i] + (i + 1 < n ? after : after * 0.0f);  // NaN * 0 is NaN
    }
}

// determinism: a "fast path" for 512-byte aligned inputs and a wrong slow path; the
// certifier's two runs place buffers at different alignments.
extern "C" __global__ void add_alignment_path(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool aligned = (reinterpret_cast<unsigned long long>(x) % 512) == 0;
    if (i < n) out[i] = aligned ? x[i] + y[i] : x[i] + 0.5f * y[i];
}

// launch (crash): a store far outside any allocation; an illegal address is a
// sticky error that leaves the CUDA context unusable.
extern "C" __global__ void add_wild_store(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i + (1ll << 40)] = x[i] + y[i];
}

// launch (timeout): spins on a flag in global memory that nothing clears. The flag is
// read through a volatile pointer, so the compiler must load it on every iteration and
// cannot prove the loop endless (a spin on a local variable is compiled away).
__device__ int add_spin_flag = 1;

extern "C" __global__ void add_spin(const float* x, const float* y, float* out, int n) {
    while (*(volatile int*)&add_spin_flag) {
    }
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}

// timing: does the real work for its first launches (every probe), then returns at
// once: timed launches finish faster than its memory traffic allows.
__device__ unsigned int add_launches;

extern "C" __global__ void add_after_warmup_skips(const float* x, const float* y, float* out,
                                                  int n) {
    if (*(volatile unsigned int*)&add_launches > 64) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&add_launches, 1u);
}

// fresh-probes: exact only for the sizes it was tested on (its spec keeps two fixed
// probes: the smallest and the largest n).
extern "C" __global__ void add_tuned_to_probes(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool tested = n == 1 || n == 4096;
    if (i < n) out[i] = tested ? x[i] + y[i] : (x[i] + y[i]) * 0.99f;
}
