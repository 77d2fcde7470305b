//! mlx-c's custom-kernel calls for CUDA and Metal behind one trait, and RAII
//! owners of the handles they return.

use super::Body;
use mlx_rs::error::Exception;
use std::ffi::{c_char, c_int, CString};

pub(crate) fn c_string(text: &str) -> Result<CString, Exception> {
    CString::new(text).map_err(|e| Exception::custom(e.to_string()))
}

/// mlx-c's custom-kernel API of one GPU backend. CUDA and Metal expose the
/// same calls under different names; only kernel creation differs (CUDA takes
/// a dynamic shared-memory size, Metal an atomic-outputs flag; we use neither).
pub(crate) trait KernelApi {
    const NAME: &'static str;
    type Kernel: Copy;
    type Config: Copy;
    /// Creates a kernel with row-contiguous inputs.
    unsafe fn kernel_new(
        name: *const c_char,
        input_names: mlx_sys::mlx_vector_string,
        output_names: mlx_sys::mlx_vector_string,
        source: *const c_char,
        header: *const c_char,
    ) -> Self::Kernel;
    fn kernel_is_null(kernel: Self::Kernel) -> bool;
    unsafe fn kernel_free(kernel: Self::Kernel);
    unsafe fn config_new() -> Self::Config;
    fn config_is_null(config: Self::Config) -> bool;
    unsafe fn config_free(config: Self::Config);
    unsafe fn add_output_arg(
        config: Self::Config,
        shape: *const c_int,
        size: usize,
        dtype: mlx_sys::mlx_dtype,
    ) -> c_int;
    unsafe fn set_grid(config: Self::Config, x: c_int, y: c_int, z: c_int) -> c_int;
    unsafe fn set_thread_group(config: Self::Config, x: c_int, y: c_int, z: c_int) -> c_int;
    unsafe fn add_template_arg_int(
        config: Self::Config,
        name: *const c_char,
        value: c_int,
    ) -> c_int;
    unsafe fn apply(
        outputs: *mut mlx_sys::mlx_vector_array,
        kernel: Self::Kernel,
        inputs: mlx_sys::mlx_vector_array,
        config: Self::Config,
        stream: mlx_sys::mlx_stream,
    ) -> c_int;
}

/// Implements [`KernelApi`] for one backend from its mlx-c function names.
macro_rules! kernel_api {
    (
        $(#[$meta:meta])* $api:ident, $name:literal, $kernel:ty, $config:ty,
        new: $new:ident($last_arg:expr), free: $free:ident,
        config_new: $config_new:ident, config_free: $config_free:ident,
        add_output_arg: $add_output_arg:ident, set_grid: $set_grid:ident,
        set_thread_group: $set_thread_group:ident,
        add_template_arg_int: $add_template_arg_int:ident, apply: $apply:ident $(,)?
    ) => {
        $(#[$meta])*
        pub(crate) struct $api;

        impl KernelApi for $api {
            const NAME: &'static str = $name;
            type Kernel = $kernel;
            type Config = $config;

            unsafe fn kernel_new(
                name: *const c_char,
                input_names: mlx_sys::mlx_vector_string,
                output_names: mlx_sys::mlx_vector_string,
                source: *const c_char,
                header: *const c_char,
            ) -> Self::Kernel {
                // ensure_row_contiguous = true: MLX copies strided inputs.
                mlx_sys::$new(
                    name,
                    input_names,
                    output_names,
                    source,
                    header,
                    true,
                    $last_arg,
                )
            }
            fn kernel_is_null(kernel: Self::Kernel) -> bool {
                kernel.ctx.is_null()
            }
            unsafe fn kernel_free(kernel: Self::Kernel) {
                mlx_sys::$free(kernel)
            }
            unsafe fn config_new() -> Self::Config {
                mlx_sys::$config_new()
            }
            fn config_is_null(config: Self::Config) -> bool {
                config.ctx.is_null()
            }
            unsafe fn config_free(config: Self::Config) {
                mlx_sys::$config_free(config)
            }
            unsafe fn add_output_arg(
                config: Self::Config,
                shape: *const c_int,
                size: usize,
                dtype: mlx_sys::mlx_dtype,
            ) -> c_int {
                mlx_sys::$add_output_arg(config, shape, size, dtype)
            }
            unsafe fn set_grid(config: Self::Config, x: c_int, y: c_int, z: c_int) -> c_int {
                mlx_sys::$set_grid(config, x, y, z)
            }
            unsafe fn set_thread_group(
                config: Self::Config,
                x: c_int,
                y: c_int,
                z: c_int,
            ) -> c_int {
                mlx_sys::$set_thread_group(config, x, y, z)
            }
            unsafe fn add_template_arg_int(
                config: Self::Config,
                name: *const c_char,
                value: c_int,
            ) -> c_int {
                mlx_sys::$add_template_arg_int(config, name, value)
            }
            unsafe fn apply(
                outputs: *mut mlx_sys::mlx_vector_array,
                kernel: Self::Kernel,
                inputs: mlx_sys::mlx_vector_array,
                config: Self::Config,
                stream: mlx_sys::mlx_stream,
            ) -> c_int {
                mlx_sys::$apply(outputs, kernel, inputs, config, stream)
            }
        }
    };
}

// Both backends' calls exist in every mlx-c build (the missing backend's
// throw at run time), so both impls compile everywhere; `Active` picks one.
kernel_api!(
    #[cfg_attr(target_os = "macos", allow(dead_code))]
    Cuda, "CUDA", mlx_sys::mlx_fast_cuda_kernel, mlx_sys::mlx_fast_cuda_kernel_config,
    new: mlx_fast_cuda_kernel_new(0), // no dynamic shared memory
    free: mlx_fast_cuda_kernel_free,
    config_new: mlx_fast_cuda_kernel_config_new,
    config_free: mlx_fast_cuda_kernel_config_free,
    add_output_arg: mlx_fast_cuda_kernel_config_add_output_arg,
    set_grid: mlx_fast_cuda_kernel_config_set_grid,
    set_thread_group: mlx_fast_cuda_kernel_config_set_thread_group,
    add_template_arg_int: mlx_fast_cuda_kernel_config_add_template_arg_int,
    apply: mlx_fast_cuda_kernel_apply,
);

kernel_api!(
    #[cfg_attr(not(target_os = "macos"), allow(dead_code))]
    Metal, "Metal", mlx_sys::mlx_fast_metal_kernel, mlx_sys::mlx_fast_metal_kernel_config,
    new: mlx_fast_metal_kernel_new(false), // no atomic outputs
    free: mlx_fast_metal_kernel_free,
    config_new: mlx_fast_metal_kernel_config_new,
    config_free: mlx_fast_metal_kernel_config_free,
    add_output_arg: mlx_fast_metal_kernel_config_add_output_arg,
    set_grid: mlx_fast_metal_kernel_config_set_grid,
    set_thread_group: mlx_fast_metal_kernel_config_set_thread_group,
    add_template_arg_int: mlx_fast_metal_kernel_config_add_template_arg_int,
    apply: mlx_fast_metal_kernel_apply,
);

/// Owns an mlx-c kernel handle.
pub(crate) struct Kernel<A: KernelApi>(pub(crate) A::Kernel);

impl<A: KernelApi> Kernel<A> {
    /// Registers `body` under its name plus a hash of its source, and with
    /// `constants` (template values written into the source, `baked`)
    /// under a name of that variant's own, those values as the source's
    /// first lines.
    pub(crate) fn new(
        body: &Body,
        input_names: &[&str],
        output_names: &[&str],
        constants: &[(&str, i32)],
    ) -> Result<Self, Exception> {
        let name = body.name;
        let full_name = match constants {
            [] => body.full_name(),
            _ => format!(
                "{}_t{:016x}",
                body.full_name(),
                super::baked::hash(constants)
            ),
        };
        let full_name = c_string(&full_name)?;
        // The body as MLX gets it: one line that includes its file, where
        // the file can be written (`include`), else the body itself.
        #[cfg(target_os = "linux")]
        let body_source = super::include::mlx_source(body, input_names);
        #[cfg(not(target_os = "linux"))]
        let body_source = body.compact_source().to_string_lossy().into_owned();
        let source = c_string(&(super::baked::constants(constants) + &body_source))?;
        let header = c_string("")?;
        let input_names = StringVector::new(input_names)?;
        let output_names = StringVector::new(output_names)?;
        // SAFETY: all pointers are valid C strings / vectors for the duration
        // of the call; mlx-c copies what it keeps.
        let raw = unsafe {
            A::kernel_new(
                full_name.as_ptr(),
                input_names.0,
                output_names.0,
                source.as_ptr(),
                header.as_ptr(),
            )
        };
        if A::kernel_is_null(raw) {
            return Err(Exception::custom(format!(
                "{} kernel {name}: MLX could not create it \
                 (is the linked libmlx built for this GPU backend?)",
                A::NAME
            )));
        }
        Ok(Kernel(raw))
    }
}

impl<A: KernelApi> Drop for Kernel<A> {
    fn drop(&mut self) {
        // SAFETY: created non-null by `kernel_new` and freed only here.
        unsafe { A::kernel_free(self.0) }
    }
}

/// Owns an mlx-c kernel config handle.
pub(crate) struct Config<A: KernelApi>(pub(crate) A::Config);

impl<A: KernelApi> Config<A> {
    pub(crate) fn new() -> Option<Self> {
        // SAFETY: allocates a config that we own.
        let raw = unsafe { A::config_new() };
        (!A::config_is_null(raw)).then_some(Config(raw))
    }
}

impl<A: KernelApi> Drop for Config<A> {
    fn drop(&mut self) {
        // SAFETY: created non-null by `config_new` and freed only here.
        unsafe { A::config_free(self.0) }
    }
}

/// Owns an mlx-c vector of strings.
pub(crate) struct StringVector(pub(crate) mlx_sys::mlx_vector_string);

impl StringVector {
    pub(crate) fn new(values: &[&str]) -> Result<Self, Exception> {
        let owned = values
            .iter()
            .map(|value| c_string(value))
            .collect::<Result<Vec<_>, _>>()?;
        let mut pointers: Vec<*const c_char> = owned.iter().map(|value| value.as_ptr()).collect();
        // SAFETY: mlx-c copies each string, so `owned` only needs to outlive the call.
        let raw =
            unsafe { mlx_sys::mlx_vector_string_new_data(pointers.as_mut_ptr(), pointers.len()) };
        if raw.ctx.is_null() {
            return Err(Exception::custom("could not create an MLX string vector"));
        }
        Ok(StringVector(raw))
    }
}

impl Drop for StringVector {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        let _ = unsafe { mlx_sys::mlx_vector_string_free(self.0) };
    }
}

/// Owns an mlx-c vector of arrays (it holds its own references to them).
pub(crate) struct ArrayVector(pub(crate) mlx_sys::mlx_vector_array);

impl Drop for ArrayVector {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        let _ = unsafe { mlx_sys::mlx_vector_array_free(self.0) };
    }
}
