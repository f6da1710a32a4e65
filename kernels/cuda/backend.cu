/* kernels/cuda/backend.cu — the CUDA backend's constructor and its memory
 * side: device selection, the compute and communication streams, tracked
 * allocation (every cudaMalloc of the backend goes through cuda_alloc and the
 * MemTracker), the scratch buffer, copies, peak-reserved measurement, and the
 * filling of the Backend table with the kernels of the other files.
 *
 * peak_reserved: the driver's view. At creation the backend records the
 * device memory in use (cudaMemGetInfo: total - free, after the context
 * exists); at every allocation and free, and when asked, it samples the
 * memory in use again and keeps the peak of (in use - that baseline). This
 * counts what cudaMalloc really reserved (page rounding included) and what
 * the libraries took (cuBLASLt, CUB's kernels' modules), but on a GPU shared
 * with other processes it also counts their growth after our start. */
#include "common.cuh"

#include <stdlib.h>
#include <string.h>

static size_t cuda_used_now(void) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return total_b - free_b;
}

static void cuda_sample_peak(CudaCtx* c) {
    size_t used = cuda_used_now();
    size_t delta = used > c->base_used ? used - c->base_used : 0;
    if (delta > c->peak_used) c->peak_used = delta;
}

void* cuda_alloc_tracked(Backend* be, size_t bytes, MemCategory cat) {
    CudaCtx* c = cuda_ctx(be);
    void* p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        fatal("%s:%d: cudaMalloc of %zu bytes (%s) failed: %s (free %zu of %zu bytes); reduce the batch size",
              __FILE__, __LINE__, bytes, mem_category_name[cat], cudaGetErrorString(e), free_b, total_b);
    }
    mem_track_alloc(&be->mem, cat, bytes);
    cuda_sample_peak(c);
    return p;
}

void cuda_release_tracked(Backend* be, void* p, size_t bytes, MemCategory cat) {
    if (!p) return;
    cuda_sample_peak(cuda_ctx(be));
    CUDA_CHECK(cudaFree(p));
    mem_track_free(&be->mem, cat, bytes);
}

static void* cuda_alloc(Backend* be, size_t bytes, MemCategory cat) {
    return cuda_alloc_tracked(be, bytes, cat);
}
static void cuda_release(Backend* be, void* p, size_t bytes, MemCategory cat) {
    cuda_release_tracked(be, p, bytes, cat);
}

void* cuda_scratch(Backend* be, size_t bytes) {
    CudaCtx* c = cuda_ctx(be);
    if (bytes <= c->scratch_bytes) return c->scratch;
    /* grow: the old buffer may still be read by queued kernels */
    if (c->scratch) {
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        cuda_release_tracked(be, c->scratch, c->scratch_bytes, MEM_OTHER);
    }
    size_t nb = (bytes + (1u << 20) - 1) & ~(size_t)((1u << 20) - 1);
    c->scratch = cuda_alloc_tracked(be, nb, MEM_OTHER);
    c->scratch_bytes = nb;
    return c->scratch;
}

static void cuda_zero(Backend* be, void* p, size_t bytes) {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_ctx(be)->stream));
}

static void cuda_to_device(Backend* be, void* dst, const void* host_src, size_t bytes) {
    CudaCtx* c = cuda_ctx(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->stream));
    /* the caller may reuse its host buffer as soon as we return */
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cuda_to_host(Backend* be, void* host_dst, const void* src, size_t bytes) {
    CudaCtx* c = cuda_ctx(be);
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cuda_copy(Backend* be, void* dst, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_ctx(be)->stream));
}

static void cuda_synchronize(Backend* be) {
    CudaCtx* c = cuda_ctx(be);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->comm_stream));
}

static size_t cuda_peak_reserved(Backend* be) {
    CudaCtx* c = cuda_ctx(be);
    cuda_sample_peak(c);
    return c->peak_used;
}

static void cuda_reset_peak(Backend* be) {
    CudaCtx* c = cuda_ctx(be);
    size_t used = cuda_used_now();
    c->peak_used = used > c->base_used ? used - c->base_used : 0;
    be->mem.peak = be->mem.total_current;
}

static void cuda_destroy(Backend* be) {
    if (!be) return;
    CudaCtx* c = cuda_ctx(be);
    CUDA_CHECK(cudaDeviceSynchronize());
    cuda_adamw_destroy(be);
    cuda_matmul_destroy(be);
    if (c->scratch) cuda_release_tracked(be, c->scratch, c->scratch_bytes, MEM_OTHER);
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    CUDA_CHECK(cudaStreamDestroy(c->comm_stream));
    free(c);
    free(be);
}

extern "C" int backend_cuda_available(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

extern "C" Backend* backend_cuda_create(DType dtype, int device_index, int allow_tf32) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        fatal("--device cuda: no CUDA GPU is visible (%s); use --device cpu",
              e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (device_index < 0)
        fatal("--device cuda: GPU index %d does not exist (this machine has %d)", device_index, n);
    /* more local ranks than GPUs: ranks share GPUs round-robin (the MPI
     * communicator handles that; NCCL refuses it, see comm_setup) */
    device_index %= n;
    CUDA_CHECK(cudaSetDevice(device_index));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
    if (prop.major < 8)
        fatal("--device cuda: GPU %d (%s) has compute capability %d.%d; this build needs 8.0 or newer",
              device_index, prop.name, prop.major, prop.minor);
    CUDA_CHECK(cudaFree(0)); /* create the context now so the baseline includes it */

    Backend* be = (Backend*)xcalloc(1, sizeof(Backend));
    CudaCtx* c = (CudaCtx*)xcalloc(1, sizeof(CudaCtx));
    be->ctx = c;
    be->name = "cuda";
    be->dtype = dtype;
    c->device = device_index;
    c->num_sms = prop.multiProcessorCount;
    c->sm90 = prop.major == 9 && prop.minor == 0;
    c->allow_tf32 = allow_tf32;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->comm_stream, cudaStreamNonBlocking));
    be->compute_stream = (void*)c->stream;
    be->comm_stream = (void*)c->comm_stream;
    c->base_used = cuda_used_now();

    be->alloc = cuda_alloc;
    be->release = cuda_release;
    be->zero = cuda_zero;
    be->to_device = cuda_to_device;
    be->to_host = cuda_to_host;
    be->copy = cuda_copy;
    be->synchronize = cuda_synchronize;
    be->peak_reserved = cuda_peak_reserved;
    be->reset_peak = cuda_reset_peak;
    be->destroy = cuda_destroy;
    be->x_to_f32 = cuda_x_to_f32;
    be->f32_to_x = cuda_f32_to_x;
    be->encoder_forward = cuda_encoder_forward;
    be->layernorm_forward = cuda_layernorm_forward;
    be->residual_layernorm_forward = cuda_residual_layernorm_forward;
    be->residual_forward = cuda_residual_forward;
    be->matmul_forward = cuda_matmul_forward;
    be->attention_forward = cuda_attention_forward;
    be->gelu_forward = cuda_gelu_forward;
    be->fused_classifier = cuda_fused_classifier;
    be->encoder_backward = cuda_encoder_backward;
    be->layernorm_backward = cuda_layernorm_backward;
    be->matmul_backward = cuda_matmul_backward;
    be->attention_backward = cuda_attention_backward;
    be->gelu_backward = cuda_gelu_backward;
    be->grad_sumsq = cuda_grad_sumsq;
    be->adamw = cuda_adamw;
    be->matmul_backward_weight = cuda_matmul_backward_weight;
    be->encoder_backward_range = cuda_encoder_backward_range;

    cuda_matmul_init(be);
    cuda_attention_init(be);
    return be;
}
