// build: does not compile (an undeclared name).

extern "C" __global__ void add_broken(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i] + bias;
}
