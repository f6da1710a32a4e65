/* kernels/backend.c — backend-independent pieces of the kernel interface:
 * dtype names, and the CUDA constructors of a build without CUDA. */
#include "kernels.h"

const char* dtype_name(DType d) { return d == DTYPE_BF16 ? "bf16" : "fp32"; }

#ifndef USE_CUDA
Backend* backend_cuda_create(DType dtype, int device_index, int allow_tf32) {
    (void)dtype;
    (void)device_index;
    (void)allow_tf32;
    fatal(
        "--device cuda: this binary was built without CUDA (nvcc was not found, or NO_CUDA=1); rebuild with nvcc on the PATH");
}
int backend_cuda_available(void) { return 0; }
#endif
