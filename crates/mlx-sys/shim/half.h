/* Flashbar: stands in for mlx-c's mlx/c/half.h (same include guard), which
 * declares the float16/bfloat16 accessors only on aarch64. MLX has both types
 * on every target, so we declare them here (force-included by build/linux.rs). */
#ifndef MLX_HALF_H
#define MLX_HALF_H

#define HAS_FLOAT16
#define HAS_BFLOAT16

#ifdef __cplusplus
/* Compiling mlx-c: use MLX's own types so item<T>() / data<T>() match. */
#include <mlx/types/half_types.h>
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#else
/* bindgen: 16-bit storage types, giving the same Rust items as on macOS
 * (a u16-backed half for float16_t, u16 for bfloat16_t). */
#include <stdint.h>
typedef __fp16 float16_t;
typedef uint16_t bfloat16_t;
#endif

#endif
