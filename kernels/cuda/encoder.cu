/* kernels/cuda/encoder.cu — token + position embedding, forward and backward.
 *
 * Backward is deterministic without float atomics:
 *  - dwpe[t] += sum over b of dout[b,t]: one thread per (t, column vector),
 *    summing b in order.
 *  - dwte: the B*T token ids are sorted with their positions (CUB's stable
 *    radix sort: equal ids keep position order), so each run of equal ids is
 *    one vocabulary row. The thread block at the first position of a run owns
 *    that dwte row: its warps sum the run's dout rows (warp w takes rows w,
 *    w+16, ...), the warps' sums are added in warp order, and the row is
 *    accumulated once. Same inputs, same order, same bits. */
#include "common.cuh"

#include <cub/cub.cuh>

template <typename T, int V>
__global__ void enc_fwd_kernel(T* out, const int* inp, const T* wte, const T* wpe, int BT, int T_,
                               int C) {
    int cv = C / V;
    size_t total = (size_t)BT * cv;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int bt = (int)(i / cv);
        int c = (int)(i % cv) * V;
        int t = bt % T_;
        int tok = inp[bt];
        float a[V], b[V];
        load_vec<V>(a, wte + (size_t)tok * C + c);
        load_vec<V>(b, wpe + (size_t)t * C + c);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] += b[k];
        store_vec<V>(out + (size_t)bt * C + c, a);
    }
}

template <typename T>
static void enc_fwd(cudaStream_t st, T* out, const int* inp, const T* wte, const T* wpe, int B,
                    int T_, int C) {
    constexpr int VV = Vec16<T>::N;
    size_t BT = (size_t)B * T_;
    if (BT == 0 || C == 0) return;
    if (C % VV == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe)) {
        size_t n = BT * (C / VV);
        enc_fwd_kernel<T, VV><<<cdiv(n, 256), 256, 0, st>>>(out, inp, wte, wpe, (int)BT, T_, C);
    } else {
        size_t n = BT * C;
        enc_fwd_kernel<T, 1><<<cdiv(n, 256), 256, 0, st>>>(out, inp, wte, wpe, (int)BT, T_, C);
    }
    LAUNCH_CHECK();
}

void cuda_encoder_forward(Backend* be, void* out, const int* inp, const void* wte, const void* wpe,
                          int B, int T, int C) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16)
        enc_fwd<bf16>(st, (bf16*)out, inp, (const bf16*)wte, (const bf16*)wpe, B, T, C);
    else
        enc_fwd<float>(st, (float*)out, inp, (const float*)wte, (const float*)wpe, B, T, C);
}

/* dwpe[t, c..c+V) += sum_b dout[b, t, c..c+V) */
template <typename T, int V>
__global__ void enc_dwpe_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
    int cv = C / V;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T_ * cv) return;
    int t = (int)(i / cv);
    int c = (int)(i % cv) * V;
    float acc[V], x[V];
#pragma unroll
    for (int k = 0; k < V; k++) acc[k] = 0.0f;
    for (int b = 0; b < B; b++) {
        load_vec<V>(x, dout + ((size_t)b * T_ + t) * C + c);
#pragma unroll
        for (int k = 0; k < V; k++) acc[k] += x[k];
    }
    T* dst = dwpe + (size_t)t * C + c;
    load_vec<V>(x, dst);
#pragma unroll
    for (int k = 0; k < V; k++) x[k] += acc[k];
    store_vec<V>(dst, x);
}

__global__ void iota_kernel(int* p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = i;
}

#define ENC_WARPS 16

template <typename T, int V, int NCH>
__global__ void __launch_bounds__(ENC_WARPS * 32)
    enc_dwte_kernel(T* dwte, const T* dout, const int* keys, const int* pos, int BT, int C) {
    extern __shared__ float red[];  /* [C] */
    int i = blockIdx.x;
    int key = keys[i];
    if (i > 0 && keys[i - 1] == key) return;  /* not the first of its run */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float acc[NCH][V];
#pragma unroll
    for (int j = 0; j < NCH; j++)
#pragma unroll
        for (int k = 0; k < V; k++) acc[j][k] = 0.0f;
    for (int r = i + warp; r < BT && keys[r] == key; r += ENC_WARPS) {
        const T* row = dout + (size_t)pos[r] * C;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int c = (j * 32 + lane) * V;
            if (c < C) {
                float x[V];
                load_vec<V>(x, row + c);
#pragma unroll
                for (int k = 0; k < V; k++) acc[j][k] += x[k];
            }
        }
    }
    /* add the warps' sums in warp order */
    for (int w = 0; w < ENC_WARPS; w++) {
        if (warp == w) {
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                int c = (j * 32 + lane) * V;
                if (c < C) {
#pragma unroll
                    for (int k = 0; k < V; k++) red[c + k] = (w == 0 ? 0.0f : red[c + k]) + acc[j][k];
                }
            }
        }
        __syncthreads();
    }
    T* dst = dwte + (size_t)key * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = from_f<T>(to_f<T>(dst[c]) + red[c]);
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

template <typename T>
static void enc_bwd(Backend* be, T* dwte, T* dwpe, const T* dout, const int* inp, int B, int T_,
                    int C) {
    cudaStream_t st = cuda_ctx(be)->stream;
    int BT = B * T_;
    if (BT == 0 || C == 0) return;
    constexpr int VV = Vec16<T>::N;
    bool vec = C % VV == 0 && aligned16(dwte) && aligned16(dwpe) && aligned16(dout);

    /* dwpe */
    if (vec) {
        size_t n = (size_t)T_ * (C / VV);
        enc_dwpe_kernel<T, VV><<<cdiv(n, 128), 128, 0, st>>>(dwpe, dout, B, T_, C);
    } else {
        size_t n = (size_t)T_ * C;
        enc_dwpe_kernel<T, 1><<<cdiv(n, 128), 128, 0, st>>>(dwpe, dout, B, T_, C);
    }
    LAUNCH_CHECK();

    /* dwte: sort (id, position) pairs, then one block per run */
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, (const int*)nullptr,
                                               (int*)nullptr, (const int*)nullptr, (int*)nullptr,
                                               BT, 0, 32, st));
    size_t ib = align256((size_t)BT * sizeof(int));
    char* s = (char*)cuda_scratch(be, 3 * ib + align256(temp_bytes));
    int* keys_out = (int*)s;
    int* vals_in = (int*)(s + ib);
    int* vals_out = (int*)(s + 2 * ib);
    void* temp = s + 3 * ib;
    iota_kernel<<<cdiv(BT, 256), 256, 0, st>>>(vals_in, BT);
    LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, inp, keys_out, vals_in, vals_out,
                                               BT, 0, 32, st));
    size_t smem = (size_t)C * sizeof(float);
    bool ok;
    if (vec) {
        ok = dispatch_nch<VV>(C, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            if constexpr (NCH * VV <= 64) {
                enc_dwte_kernel<T, VV, NCH><<<BT, ENC_WARPS * 32, smem, st>>>(dwte, dout, keys_out,
                                                                              vals_out, BT, C);
                return true;
            } else {
                return false;
            }
        });
    } else {
        ok = dispatch_nch<1>(C, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            enc_dwte_kernel<T, 1, NCH><<<BT, ENC_WARPS * 32, smem, st>>>(dwte, dout, keys_out,
                                                                        vals_out, BT, C);
            return true;
        });
    }
    if (!ok) fatal("encoder_backward: C=%d is larger than the CUDA backend supports (2048)", C);
    LAUNCH_CHECK();
}

void cuda_encoder_backward(Backend* be, void* dwte, void* dwpe, const void* dout, const int* inp,
                           int B, int T, int C) {
    if (be->dtype == DTYPE_BF16)
        enc_bwd<bf16>(be, (bf16*)dwte, (bf16*)dwpe, (const bf16*)dout, inp, B, T, C);
    else
        enc_bwd<float>(be, (float*)dwte, (float*)dwpe, (const float*)dout, inp, B, T, C);
}
