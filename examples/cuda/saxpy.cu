// y <- a * x + y, one element per thread.
extern "C" __global__ void saxpy(const float* __restrict__ x, float* __restrict__ y, float a,
                                 int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = fmaf(a, x[i], y[i]);
    }
}
