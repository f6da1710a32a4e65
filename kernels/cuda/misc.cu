/* kernels/cuda/misc.cu — the elementwise kernels: X <-> fp32 conversion,
 * residual add, tanh-GELU forward and backward. 16-byte accesses when n and
 * every pointer allow them, scalar otherwise; grid-stride loops. */
#include "common.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

__device__ __forceinline__ float gelu_f(float x) {
    float u = GELU_K * (x + GELU_C * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad_f(float x) {
    float u = GELU_K * (x + GELU_C * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + x * 0.5f * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}

static unsigned ew_blocks(size_t nvec, int threads) {
    size_t b = (nvec + threads - 1) / threads;
    if (b > 65535u * 16u) b = 65535u * 16u;
    if (b == 0) b = 1;
    return (unsigned)b;
}

/* ---- conversions ---- */
template <typename S, typename D, int V> __global__ void convert_kernel(D* dst, const S* src, size_t nvec) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nvec;
         i += (size_t)gridDim.x * blockDim.x) {
        float x[V];
        load_vec<V>(x, src + i * V);
        store_vec<V>(dst + i * V, x);
    }
}

template <typename S, typename D> static void convert_launch(cudaStream_t st, D* dst, const S* src, size_t n) {
    if (n == 0) return;
    constexpr int V = 4; /* 4 elements: 16 bytes of fp32, 8 of bf16 */
    if (n % V == 0 && aligned16(dst) && aligned16(src)) {
        convert_kernel<S, D, V><<<ew_blocks(n / V, 256), 256, 0, st>>>(dst, src, n / V);
    } else {
        convert_kernel<S, D, 1><<<ew_blocks(n, 256), 256, 0, st>>>(dst, src, n);
    }
    LAUNCH_CHECK();
}

void cuda_x_to_f32(Backend* be, float* dst, const void* src, size_t n) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16) convert_launch<bf16, float>(st, dst, (const bf16*)src, n);
    else convert_launch<float, float>(st, dst, (const float*)src, n);
}
void cuda_f32_to_x(Backend* be, void* dst, const float* src, size_t n) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16) convert_launch<float, bf16>(st, (bf16*)dst, src, n);
    else convert_launch<float, float>(st, (float*)dst, src, n);
}

/* ---- binary elementwise: op 0 residual add, 1 gelu backward (a=inp, b=dout) ---- */
template <typename T, int V, int OP>
__global__ void binary_kernel(T* out, const T* a, const T* b, size_t nvec) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nvec;
         i += (size_t)gridDim.x * blockDim.x) {
        float x[V], y[V], r[V];
        load_vec_cs<V>(x, a + i * V);
        load_vec_cs<V>(y, b + i * V);
#pragma unroll
        for (int k = 0; k < V; k++) r[k] = OP == 0 ? x[k] + y[k] : gelu_grad_f(x[k]) * y[k];
        store_vec<V>(out + i * V, r);
    }
}

template <typename T, int OP>
static void binary_launch(cudaStream_t st, T* out, const T* a, const T* b, size_t n) {
    if (n == 0) return;
    constexpr int V = Vec16<T>::N;
    if (n % V == 0 && aligned16(out) && aligned16(a) && aligned16(b)) {
        binary_kernel<T, V, OP><<<ew_blocks(n / V, 256), 256, 0, st>>>(out, a, b, n / V);
    } else {
        binary_kernel<T, 1, OP><<<ew_blocks(n, 256), 256, 0, st>>>(out, a, b, n);
    }
    LAUNCH_CHECK();
}

void cuda_residual_forward(Backend* be, void* out, const void* inp1, const void* inp2, size_t n) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16)
        binary_launch<bf16, 0>(st, (bf16*)out, (const bf16*)inp1, (const bf16*)inp2, n);
    else binary_launch<float, 0>(st, (float*)out, (const float*)inp1, (const float*)inp2, n);
}

void cuda_gelu_backward(Backend* be, void* dinp, const void* inp, const void* dout, size_t n) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16)
        binary_launch<bf16, 1>(st, (bf16*)dinp, (const bf16*)inp, (const bf16*)dout, n);
    else binary_launch<float, 1>(st, (float*)dinp, (const float*)inp, (const float*)dout, n);
}

/* ---- gelu forward ---- */
template <typename T, int V> __global__ void gelu_fwd_kernel(T* out, const T* inp, size_t nvec) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nvec;
         i += (size_t)gridDim.x * blockDim.x) {
        float x[V];
        load_vec<V>(x, inp + i * V);
#pragma unroll
        for (int k = 0; k < V; k++) x[k] = gelu_f(x[k]);
        store_vec<V>(out + i * V, x);
    }
}

template <typename T> static void gelu_fwd_launch(cudaStream_t st, T* out, const T* inp, size_t n) {
    if (n == 0) return;
    constexpr int V = Vec16<T>::N;
    if (n % V == 0 && aligned16(out) && aligned16(inp)) {
        gelu_fwd_kernel<T, V><<<ew_blocks(n / V, 256), 256, 0, st>>>(out, inp, n / V);
    } else {
        gelu_fwd_kernel<T, 1><<<ew_blocks(n, 256), 256, 0, st>>>(out, inp, n);
    }
    LAUNCH_CHECK();
}

void cuda_gelu_forward(Backend* be, void* out, const void* inp, size_t n) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16) gelu_fwd_launch<bf16>(st, (bf16*)out, (const bf16*)inp, n);
    else gelu_fwd_launch<float>(st, (float*)out, (const float*)inp, n);
}
