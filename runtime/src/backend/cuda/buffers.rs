//! Device memory as the [`crate::backend::device::Device`] trait sees it: buffers of f32 or of
//! a 16-bit dtype, views of them, token-id buffers, and page-locked host memory.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{result as drv, CudaContext, CudaSlice, CudaStream};

use crate::precision::Dtype;

/// A read-only view of device memory (a pointer and a length; `Copy`, as the backend needs).
#[derive(Debug, Clone, Copy)]
pub struct DevView<'a> {
    pub(super) ptr: u64,
    pub(super) len: usize,
    /// F32, or the half dtype of a 16-bit buffer ([`Device::alloc_half`]).
    pub(super) elem: Dtype,
    pub(super) _borrow: PhantomData<&'a CudaSlice<f32>>,
}

/// A writable view of device memory.
#[derive(Debug)]
pub struct DevViewMut<'a> {
    pub(super) ptr: u64,
    pub(super) len: usize,
    pub(super) elem: Dtype,
    pub(super) _borrow: PhantomData<&'a mut CudaSlice<f32>>,
}

/// Bytes per element of a buffer of `elem`.
pub(super) fn size(elem: Dtype) -> u64 {
    if elem.is_half() {
        2
    } else {
        4
    }
}

/// `src` as the 16 bits of `half`, rounded to nearest even (exact for values stored rounded).
pub(super) fn narrow(src: &[f32], half: Dtype) -> Vec<u16> {
    src.iter().map(|&x| half.bits(x)).collect()
}

/// 16-bit values of `half` as floats (exact).
pub(super) fn widen(src: &[u16], dst: &mut [f32], half: Dtype) {
    for (d, &b) in dst.iter_mut().zip(src) {
        *d = half.from_bits(b);
    }
}

/// Token ids, labels or masks on the device: an allocation, of which a batch uses a prefix
/// (the kernels take their lengths as arguments).
#[derive(Debug)]
pub struct DevIds(pub(super) Option<CudaSlice<u32>>);

/// Makes `ctx` the calling thread's current context. cudarc's `bind_to_thread` first returns
/// (and clears) an error an earlier asynchronous call left in the context, without binding, so
/// after such an error it is called a second time to bind; the first error is returned.
pub(super) fn bind_ctx(ctx: &CudaContext) -> Result<(), drv::DriverError> {
    match ctx.bind_to_thread() {
        Ok(()) => Ok(()),
        Err(first) => {
            let _ = ctx.bind_to_thread();
            Err(first)
        }
    }
}

// Device memory is freed stream-ordered on the current context (cudarc's `CudaSlice::drop`,
// `cuMemFreeAsync` on the stream it was allocated on: the device's, the legacy default one or,
// with CUDA graphs, one of its own; `CudaDevice::outside_capture` keeps releases out of a
// capture), and a run on several GPUs drops every rank's buffers on
// the main thread, whose current context is the last GPU opened: each buffer binds its own
// context first.
impl Drop for DevIds {
    fn drop(&mut self) {
        if let Some(m) = &self.0 {
            let _ = bind_ctx(m.context());
        }
    }
}

/// A device buffer of `len` floats: its allocation may be longer, from a longer batch, so that a
/// workspace resized for a shorter one allocates nothing ([`Device::resize`]).
#[derive(Debug)]
pub struct DevBuf {
    /// `None` when the allocation failed (`CudaDevice::out_of_memory`: nothing runs on the
    /// device after that, so nothing reads it).
    pub(super) mem: Option<CudaSlice<f32>>,
    pub(super) len: usize,
    /// F32, or the half dtype of a 16-bit buffer (two elements per float of `mem`).
    pub(super) elem: Dtype,
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // As `DevIds`: freed on its own GPU's context.
        if let Some(m) = &self.mem {
            let _ = bind_ctx(m.context());
        }
    }
}

/// A buffer's device address, 0 for a failed allocation.
pub(super) fn address<T>(mem: &Option<CudaSlice<T>>, stream: &Arc<CudaStream>) -> u64 {
    mem.as_ref()
        .map_or(0, |m| cudarc::driver::DevicePtr::device_ptr(m, stream).0)
}

/// Page-locked host memory ([`Device::Pinned`]), allocated by
/// [`CudaContext::alloc_pinned_with_flags`]; ordinary memory when the system refuses to lock
/// more (the copies are then staged by the driver: slower, the same bytes).
pub struct Pinned {
    /// Owns the allocation (freed on drop); read through `ptr`.
    pub(super) _slice: Option<cudarc::driver::PinnedHostSlice<f32>>,
    /// The fallback's memory, when not page-locked.
    pub(super) _pageable: Vec<f32>,
    pub(super) ptr: *mut f32,
    /// The floats asked for (the allocation has at least one).
    pub(super) len: usize,
}

// SAFETY: `ptr` points into `_slice`'s allocation, which `Pinned` owns (cudarc marks
// `PinnedHostSlice` Send and Sync); it is moved, never shared, between threads.
unsafe impl Send for Pinned {}

impl std::ops::Deref for Pinned {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `ptr` points at `_slice`'s (or `_pageable`'s) `len` or more floats, alive
        // while `self` is (a Vec's heap buffer does not move with it).
        // Copies into or out of it go through [`Device::download`]/[`Device::write`], which the
        // caller synchronises before reading (the runtime's device calls sync at every step).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for Pinned {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as `deref`, and `&mut self` makes it the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
