/* kernels/cuda/encoder.cu — token + position embedding, forward and backward.
 *
 * Backward is deterministic without float atomics:
 *  - dwpe[t] += sum over b of dout[b,t]: one thread per (t, column vector),
 *    summing b in order.
 *  - dwte: the B*T token ids are sorted with their positions (CUB's stable
 *    radix sort: equal ids keep position order), so each run of equal ids is
 *    one vocabulary row; runs are summed in fixed chunks of the sorted array
 *    and the pieces of long runs added in chunk order (enc_dwte_phase_a/b).
 *    Same inputs, same order, same bits.
 *  - encoder_backward_range (ZeRO-2's wte chunks): the same sort of
 *    all B*T ids and the same chunks of the sorted array; runs whose id is
 *    outside [v0, v1) are skipped, so every row in the range gets exactly
 *    the terms, in the order, of the whole-range call. The whole-range call
 *    (encoder_backward) costs what it did: one comparison per run more. A
 *    chunked backward pays one sort per chunk (B*T ints, tens of us). */
#include "common.cuh"

#include <cub/cub.cuh>
#include <climits>

template <typename T, int V>
__global__ void enc_fwd_kernel(T* out, const int* inp, const T* wte, const T* wpe, int BT, int T_, int C) {
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
static void enc_fwd(cudaStream_t st, T* out, const int* inp, const T* wte, const T* wpe, int B, int T_, int C) {
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

void cuda_encoder_forward(Backend* be, void* out, const int* inp, const void* wte, const void* wpe, int B,
                          int T, int C) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16)
        enc_fwd<bf16>(st, (bf16*)out, inp, (const bf16*)wte, (const bf16*)wpe, B, T, C);
    else enc_fwd<float>(st, (float*)out, inp, (const float*)wte, (const float*)wpe, B, T, C);
}

/* dwpe[t, c..c+V) += sum_b dout[b, t, c..c+V), b in order, with the loads
 * of ENC_PE_U rows in flight */
#define ENC_PE_U 8
template <typename T, int V> __global__ void enc_dwpe_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
    int cv = C / V;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T_ * cv) return;
    int t = (int)(i / cv);
    int c = (int)(i % cv) * V;
    float acc[V], x[V];
#pragma unroll
    for (int k = 0; k < V; k++) acc[k] = 0.0f;
    const T* src = dout + (size_t)t * C + c;
    const size_t bstride = (size_t)T_ * C;
    int b = 0;
    for (; b + ENC_PE_U <= B; b += ENC_PE_U) {
        RawVec<V, T> r[ENC_PE_U];
#pragma unroll
        for (int u = 0; u < ENC_PE_U; u++) r[u].load(src + (size_t)(b + u) * bstride);
#pragma unroll
        for (int u = 0; u < ENC_PE_U; u++)
#pragma unroll
            for (int k = 0; k < V; k++) acc[k] += r[u][k];
    }
    for (; b < B; b++) {
        load_vec<V>(x, src + (size_t)b * bstride);
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

/* dwte from the sorted (id, position) pairs. The sorted array is cut into
 * chunks of ENC_R positions, a warp per chunk (phase A). A run of equal ids
 * that lies inside one chunk is summed (positions in order) and added to its
 * dwte row by that warp alone. A run that crosses chunk boundaries is summed
 * piecewise: the chunk where it starts leaves its part in part_last[chunk]
 * and raises owner[chunk]; every later chunk that the run reaches leaves its
 * leading part in part_first[chunk]. Phase B: the owner chunk's warp adds its
 * part and the following chunks' parts in chunk order, then accumulates the
 * row once. Every row gets its terms in one fixed order: deterministic, and
 * a very frequent token is spread over many warps. */
#define ENC_R 32
#define ENC_WARPS 8

/* Phase A walks its chunk's positions in order with the next row's load in
 * flight, and a run's dwte row loaded when the run starts (if the run ends
 * in that row, not in a part): a warp waits for about one latency a row, not
 * two or three (row, then dwte). The chunk's ids and positions are one load,
 * a lane each (ENC_R == 32). */
static_assert(ENC_R == 32, "phase A keeps a chunk's ids and positions a lane each");

template <typename T, int V, int NCH>
__global__ void __launch_bounds__(ENC_WARPS * 32)
    enc_dwte_phase_a(T* dwte, float* part_first, float* part_last, int* owner, const T* dout, const int* keys,
                     const int* pos, int BT, int C, int v0, int v1) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunk = blockIdx.x * ENC_WARPS + warp;
    const int start = chunk * ENC_R;
    if (start >= BT) return;
    const int n = min(BT - start, ENC_R);
    const int my_key = lane < n ? keys[start + lane] : 0;
    const int my_pos = lane < n ? pos[start + lane] : 0;
    const bool has_before = start > 0, has_after = start + n < BT;
    const int key_before = has_before ? keys[start - 1] : 0;
    const int key_after = has_after ? keys[start + n] : 0;
    auto key_at = [&](int r) { return __shfl_sync(0xffffffffu, my_key, r); };
    auto in_range = [&](int key) { return key >= v0 && key < v1; };
    auto dwte_row = [&](int key) { return dwte + (size_t)(key - v0) * C; };
    /* a run of the id just before (after) the chunk began in an earlier
     * chunk (goes on into the next one): keys are sorted, so such a run is
     * the chunk's first (last), and its sum is a part, not added to dwte here */
    auto joins_before = [&](int key) { return has_before && key_before == key; };
    auto joins_after = [&](int key) { return has_after && key_after == key; };
    /* this lane's columns of a row */
    auto load_cols = [&](RawVec<V, T>* x, const T* row) {
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int c = (j * 32 + lane) * V;
            if (c < C) x[j].load(row + c);
        }
    };
    auto load_row = [&](RawVec<V, T>* x, int r) {
        load_cols(x, dout + (size_t)__shfl_sync(0xffffffffu, my_pos, r) * C);
    };
    RawVec<V, T> cur[NCH], nxt[NCH], wrow[NCH];
    float acc[NCH][V];
#pragma unroll
    for (int j = 0; j < NCH; j++)
#pragma unroll
        for (int k = 0; k < V; k++) acc[j][k] = 0.0f;
    int own = 0, run_start = 0;
    int key = key_at(0);
    load_row(cur, 0); /* row 0 even when its id is another call's: nxt starts as a copy */
#pragma unroll
    for (int j = 0; j < NCH; j++) wrow[j] = nxt[j] = cur[j];
    if (in_range(key) && !joins_before(key) && !joins_after(key)) load_cols(wrow, dwte_row(key));
    for (int r = 0; r < n; r++) {
        const bool more = r + 1 < n;
        const int next_key = key_at(more ? r + 1 : r);
        if (more && in_range(next_key)) load_row(nxt, r + 1);
        if (in_range(key)) {
#pragma unroll
            for (int j = 0; j < NCH; j++)
#pragma unroll
                for (int k = 0; k < V; k++) acc[j][k] += cur[j][k];
        }
        if (!more || next_key != key) {
            /* the run [run_start, r] of id key ends here */
            if (in_range(key)) {
                const bool before = run_start == 0 && joins_before(key);
                const bool after = joins_after(key);
                float* dst = nullptr;
                if (before) dst = part_first + (size_t)chunk * C;
                else if (after) {
                    dst = part_last + (size_t)chunk * C;
                    own = 1;
                }
#pragma unroll
                for (int j = 0; j < NCH; j++) {
                    int c = (j * 32 + lane) * V;
                    if (c < C) {
                        if (dst) {
#pragma unroll
                            for (int k = 0; k < V; k++) dst[c + k] = acc[j][k];
                        } else {
                            float w[V];
#pragma unroll
                            for (int k = 0; k < V; k++) w[k] = wrow[j][k] + acc[j][k];
                            store_vec<V>(dwte_row(key) + c, w);
                        }
                    }
#pragma unroll
                    for (int k = 0; k < V; k++) acc[j][k] = 0.0f;
                }
            }
            run_start = r + 1;
            key = next_key;
            /* the next run never starts at position 0, so it is never "before" */
            if (more && in_range(key) && !joins_after(key)) load_cols(wrow, dwte_row(key));
        }
#pragma unroll
        for (int j = 0; j < NCH; j++) cur[j] = nxt[j];
    }
    if (lane == 0) owner[chunk] = own;
}

template <typename T, int V, int NCH>
__global__ void __launch_bounds__(ENC_WARPS * 32)
    enc_dwte_phase_b(T* dwte, const float* part_first, const float* part_last, const int* owner,
                     const int* keys, int BT, int C, int nchunks, int v0) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunk = blockIdx.x * ENC_WARPS + warp;
    if (chunk >= nchunks || !owner[chunk]) return;
    const int end = min(BT, chunk * ENC_R + ENC_R);
    const int key = keys[end - 1];
    float acc[NCH][V];
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int c = (j * 32 + lane) * V;
#pragma unroll
        for (int k = 0; k < V; k++) acc[j][k] = c < C ? part_last[(size_t)chunk * C + c + k] : 0.0f;
    }
    for (int c2 = chunk + 1; c2 < nchunks; c2++) {
        const int s2 = c2 * ENC_R;
        if (keys[s2] != key) break;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int c = (j * 32 + lane) * V;
            if (c < C) {
#pragma unroll
                for (int k = 0; k < V; k++) acc[j][k] += part_first[(size_t)c2 * C + c + k];
            }
        }
        const int e2 = min(BT, s2 + ENC_R);
        if (keys[e2 - 1] != key) break; /* the run ends inside chunk c2 */
    }
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int c = (j * 32 + lane) * V;
        if (c < C) {
            T* w = dwte + (size_t)(key - v0) * C + c; /* (owner is set only for runs in range) */
            float cur[V];
            load_vec<V>(cur, w);
#pragma unroll
            for (int k = 0; k < V; k++) cur[k] += acc[j][k];
            store_vec<V>(w, cur);
        }
    }
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

template <typename T>
static void enc_bwd(Backend* be, T* dwte, T* dwpe, const T* dout, const int* inp, int B, int T_, int C, int v0,
                    int v1) {
    cudaStream_t st = cuda_ctx(be)->stream;
    int BT = B * T_;
    if (BT == 0 || C == 0) return;
    constexpr int VV = Vec16<T>::N;
    bool vec = C % VV == 0 && (!dwte || aligned16(dwte)) && (!dwpe || aligned16(dwpe)) && aligned16(dout);

    /* dwpe */
    if (dwpe) {
        if (vec) {
            size_t n = (size_t)T_ * (C / VV);
            enc_dwpe_kernel<T, VV><<<cdiv(n, 128), 128, 0, st>>>(dwpe, dout, B, T_, C);
        } else {
            size_t n = (size_t)T_ * C;
            enc_dwpe_kernel<T, 1><<<cdiv(n, 128), 128, 0, st>>>(dwpe, dout, B, T_, C);
        }
        LAUNCH_CHECK();
    }
    if (!dwte || v0 >= v1) return;

    /* dwte: sort (id, position) pairs, then one block per run */
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, (const int*)nullptr, (int*)nullptr,
                                               (const int*)nullptr, (int*)nullptr, BT, 0, 32, st));
    const int nchunks = (BT + ENC_R - 1) / ENC_R;
    size_t ib = align256((size_t)BT * sizeof(int));
    size_t pb = align256((size_t)nchunks * C * sizeof(float));
    size_t ob = align256((size_t)nchunks * sizeof(int));
    char* s = (char*)cuda_scratch(be, 3 * ib + 2 * pb + ob + align256(temp_bytes));
    int* keys_out = (int*)s;
    int* vals_in = (int*)(s + ib);
    int* vals_out = (int*)(s + 2 * ib);
    float* part_first = (float*)(s + 3 * ib);
    float* part_last = (float*)(s + 3 * ib + pb);
    int* owner = (int*)(s + 3 * ib + 2 * pb);
    void* temp = s + 3 * ib + 2 * pb + ob;
    iota_kernel<<<cdiv(BT, 256), 256, 0, st>>>(vals_in, BT);
    LAUNCH_CHECK();
    CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(temp, temp_bytes, inp, keys_out, vals_in, vals_out, BT, 0, 32, st));
    unsigned grid = cdiv(nchunks, ENC_WARPS);
    auto launch = [&](auto a, auto b) {
        a<<<grid, ENC_WARPS * 32, 0, st>>>(
            dwte, part_first, part_last, owner, dout, keys_out, vals_out, BT, C, v0, v1);
        LAUNCH_CHECK();
        b<<<grid, ENC_WARPS * 32, 0, st>>>(dwte, part_first, part_last, owner, keys_out, BT, C, nchunks, v0);
        LAUNCH_CHECK();
    };
    bool ok;
    if (vec) {
        ok = dispatch_nch<VV>(C, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            if constexpr (NCH * VV <= 64) {
                launch(enc_dwte_phase_a<T, VV, NCH>, enc_dwte_phase_b<T, VV, NCH>);
                return true;
            } else {
                return false;
            }
        });
    } else {
        ok = dispatch_nch<1>(C, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            launch(enc_dwte_phase_a<T, 1, NCH>, enc_dwte_phase_b<T, 1, NCH>);
            return true;
        });
    }
    if (!ok) fatal("encoder_backward: C=%d is larger than the CUDA backend supports (2048)", C);
}

void cuda_encoder_backward_range(Backend* be, void* dwte, void* dwpe, const void* dout, const int* inp, int B,
                                 int T, int C, int v0, int v1) {
    if (be->dtype == DTYPE_BF16)
        enc_bwd<bf16>(be, (bf16*)dwte, (bf16*)dwpe, (const bf16*)dout, inp, B, T, C, v0, v1);
    else enc_bwd<float>(be, (float*)dwte, (float*)dwpe, (const float*)dout, inp, B, T, C, v0, v1);
}

void cuda_encoder_backward(Backend* be, void* dwte, void* dwpe, const void* dout, const int* inp, int B, int T,
                           int C) {
    cuda_encoder_backward_range(be, dwte, dwpe, dout, inp, B, T, C, 0, INT_MAX);
}
