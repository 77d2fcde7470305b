// Flashbar's one call beside mlx-c: MLX's `fast::precompiled_cuda_kernel`,
// which mlx-c 0.7.0 does not bind. MLX compiles a `cuda_kernel` again in
// every process (its disk cache skips custom kernels), so with
// FLASHBAR_KERNEL_CACHE Flashbar compiles its kernels itself, keeps the PTX
// on disk, and launches it through this call (docs/gpu.md, "The kernel
// cache"). Built with the `cuda` feature.

#include "mlx/c/error.h"
#include "mlx/c/private/mlx.h"
#include "mlx/fast.h"

// `binary`: `binary_len` bytes of PTX, with its NUL. The outputs
// are `n_outputs` arrays, output i with `output_ndims[i]` dimensions read in
// turn from `output_shapes`; `scalars` are int arguments after the outputs.
extern "C" int flashbar_precompiled_cuda_kernel(
    mlx_vector_array* outputs,
    const char* name,
    const char* binary,
    size_t binary_len,
    const mlx_vector_array inputs,
    const int* output_shapes,
    const size_t* output_ndims,
    const mlx_dtype* output_dtypes,
    size_t n_outputs,
    const int* scalars,
    size_t n_scalars,
    const int* grid,
    const int* thread_group,
    const mlx_stream stream) {
  try {
    std::vector<mlx::core::Shape> shapes;
    std::vector<mlx::core::Dtype> dtypes;
    size_t at = 0;
    for (size_t i = 0; i < n_outputs; ++i) {
      shapes.emplace_back(output_shapes + at, output_shapes + at + output_ndims[i]);
      at += output_ndims[i];
      dtypes.push_back(mlx_dtype_to_cpp(output_dtypes[i]));
    }
    std::vector<mlx::core::fast::ScalarArg> args;
    for (size_t i = 0; i < n_scalars; ++i) {
      args.emplace_back(scalars[i]);
    }
    mlx_vector_array_set_(
        *outputs,
        mlx::core::fast::precompiled_cuda_kernel(
            name,
            std::string(binary, binary_len),
            mlx_vector_array_get_(inputs),
            shapes,
            dtypes,
            args,
            {grid[0], grid[1], grid[2]},
            {thread_group[0], thread_group[1], thread_group[2]},
            /* shared_memory */ 0,
            std::nullopt,
            /* ensure_row_contiguous */ true,
            mlx_stream_get_(stream)));
  } catch (std::exception& e) {
    mlx_error("%s", e.what());
    return 1;
  }
  return 0;
}
