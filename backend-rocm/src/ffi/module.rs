//! Code objects and kernel launches.

use std::ffi::{CStr, c_int, c_uint, c_void};

use super::{HIP_SUCCESS, Handle, Hip, HipStatus};

impl Hip {
    /// `hipModuleLoadData`.
    ///
    /// # Safety
    /// `image` points at a complete code object (or hiprtc output) that stays valid for the call.
    pub unsafe fn module_load_data(&self, image: *const c_void) -> Result<Handle, HipStatus> {
        let mut m = std::ptr::null_mut();
        // SAFETY: `m` is a valid out-pointer; `image` per the caller's contract.
        let s = unsafe { (self.fns.hipModuleLoadData)(&mut m, image) };
        if s == HIP_SUCCESS { Ok(m) } else { Err(s) }
    }

    /// `hipModuleUnload`.
    ///
    /// # Safety
    /// `module` came from [`Hip::module_load_data`]; none of its functions is used afterwards.
    pub unsafe fn module_unload(&self, module: Handle) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipModuleUnload)(module) }
    }

    /// `hipModuleGetFunction`.
    pub fn module_get_function(&self, module: Handle, name: &CStr) -> Result<Handle, HipStatus> {
        let mut f = std::ptr::null_mut();
        // SAFETY: `f` is a valid out-pointer, `module` is a live module handle, and `name` is
        // NUL-terminated.
        let s = unsafe { (self.fns.hipModuleGetFunction)(&mut f, module, name.as_ptr()) };
        if s == HIP_SUCCESS { Ok(f) } else { Err(s) }
    }

    /// `hipModuleOccupancyMaxActiveBlocksPerMultiprocessor`: blocks of `block` threads (and
    /// `dynamic_shared` bytes) one compute unit runs at once.
    pub fn max_active_blocks(
        &self,
        function: Handle,
        block: u32,
        dynamic_shared: usize,
    ) -> Result<u32, HipStatus> {
        let mut n: c_int = 0;
        let block = c_int::try_from(block).unwrap_or(c_int::MAX);
        // SAFETY: `n` is a valid out-pointer and `function` a live function handle.
        let s = unsafe {
            (self.fns.hipModuleOccupancyMaxActiveBlocksPerMultiprocessor)(
                &mut n,
                function,
                block,
                dynamic_shared,
            )
        };
        if s == HIP_SUCCESS {
            Ok(u32::try_from(n).unwrap_or(0))
        } else {
            Err(s)
        }
    }

    /// `hipModuleLaunchKernel` with a 1-D grid and block.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each pointing at a value of exactly the
    /// parameter's type; every device pointer among them stays valid until the launch completes
    /// on `stream`.
    pub unsafe fn launch(
        &self,
        function: Handle,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared_bytes: c_uint,
        stream: Handle,
        params: &mut [*mut c_void],
    ) -> HipStatus {
        // SAFETY: forwarded from the caller's contract; `extra` is null as HIP allows.
        unsafe {
            (self.fns.hipModuleLaunchKernel)(
                function,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
    }
}
