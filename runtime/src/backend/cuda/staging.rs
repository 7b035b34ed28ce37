//! Token ids (and the dropout key) go up from page-locked host memory.
//!
//! A copy from pageable memory is staged by the driver through a pinned buffer of its own, and
//! "the driver may synchronize with the stream" before it (CUDA runtime API, "API
//! synchronization behavior", for `cudaMemcpyAsync` from pageable memory): the host would wait
//! for the micro-batch the GPU is running before it could queue the next one's ids, and the GPU
//! would then idle while the host queues the rest. Here each array is first written into a slot
//! of a ring of pinned buffers and copied up from there; each slot keeps the event of its last
//! copy, and is written again only once that copy ran — with [`SLOTS`] slots (a micro-batch
//! writes four arrays and a key or two) long done, so the wait costs one query.

use cudarc::driver::{result as drv, sys as drv_sys, CudaContext, CudaEvent, PinnedHostSlice};
use std::sync::Arc;

use super::CudaDevice;

/// Slots in the ring: four micro-batches' id arrays.
const SLOTS: usize = 16;

/// The ring of pinned slots ([`CudaDevice::copy_ids_up`]).
#[derive(Default)]
pub(super) struct IdsStaging {
    /// Allocated as first used, grown (replaced) for a longer array.
    slots: Vec<Slot>,
    /// The slot the next copy takes.
    next: usize,
    /// The system refused to lock more memory: copies go from the caller's (pageable) memory,
    /// staged by the driver (slower, the same bytes).
    refused: bool,
}

/// One pinned buffer and the event recorded after the last copy out of it.
struct Slot {
    /// Owns the allocation; written through `ptr`.
    host: PinnedHostSlice<u32>,
    ptr: *mut u32,
    copied: CudaEvent,
}

// SAFETY: `ptr` points into `host`'s allocation, which the slot owns (cudarc marks
// `PinnedHostSlice` Send); the ring is used under its device's lock.
unsafe impl Send for Slot {}

impl Slot {
    /// A slot of at least `n` ids (a power of two, so that a longer batch rarely grows it).
    fn new(ctx: &Arc<CudaContext>, n: usize) -> Option<Slot> {
        let cap = n.max(64).next_power_of_two();
        // Flags 0, as `Device::alloc_pinned`'s: write-combining (cudarc's default) could only
        // speed the host's sequential writes of a few KiB.
        // SAFETY: every copy out of it reads only the prefix written just before.
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u32>(cap, 0) }.ok()?;
        let ptr = host.as_mut_ptr().ok()?;
        let copied = ctx.new_event(None).ok()?;
        Some(Slot { host, ptr, copied })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The pinned memory is freed after this (a field); a copy still queued out of it would
        // read freed memory.
        let _ = self.copied.synchronize();
    }
}

impl CudaDevice {
    /// Queues the copy of `src` into the device ids at `dst` on the compute stream, through a
    /// pinned slot: the host neither waits for the stream nor may change `src`'s copy once
    /// queued. During a capture (which nothing uploads in: a replay must not read the host) it
    /// copies from `src` as before, and the driver refuses it, failing the capture.
    ///
    /// # Safety
    /// `dst` is a live allocation of this device's of at least `src.len()` ids.
    pub(super) unsafe fn copy_ids_up(&self, dst: u64, src: &[u32]) -> Result<(), drv::DriverError> {
        let capturing = self
            .captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capturing
            .is_some();
        let mut ring = self.ids_staging.lock().unwrap_or_else(|p| p.into_inner());
        let slot = if capturing {
            None
        } else {
            self.free_slot(&mut ring, src.len())
        };
        let Some(slot) = slot.map(|i| &mut ring.slots[i]) else {
            // SAFETY: `dst` holds `src.len()` ids (the caller's contract).
            return unsafe { drv::memcpy_htod_async(dst, src, self.stream.cu_stream()) };
        };
        debug_assert!(slot.host.len() >= src.len());
        // SAFETY: `ptr` points at `host.len() >= src.len()` ids, which no queued copy reads
        // any more (`free_slot` waited for its last).
        let host = unsafe { std::slice::from_raw_parts_mut(slot.ptr, src.len()) };
        host.copy_from_slice(src);
        // SAFETY: as above; the slot is not written again before `copied` says the copy ran.
        unsafe { drv::memcpy_htod_async(dst, &*host, self.stream.cu_stream()) }?;
        slot.copied.record(&self.stream)
    }

    /// The next slot of the ring, of at least `n` ids, once its last copy ran; `None` when the
    /// system will not lock more memory.
    fn free_slot(&self, ring: &mut IdsStaging, n: usize) -> Option<usize> {
        if ring.refused {
            return None;
        }
        let i = ring.next;
        ring.next = (i + 1) % SLOTS;
        if let Some(slot) = ring.slots.get(i) {
            self.wait_copied(&slot.copied);
            if slot.host.len() >= n {
                return Some(i);
            }
        }
        let Some(fresh) = Slot::new(&self.ctx, n) else {
            ring.refused = true;
            return None;
        };
        if i < ring.slots.len() {
            ring.slots[i] = fresh;
        } else {
            ring.slots.push(fresh);
        }
        Some(i)
    }

    /// Waits until `event`'s copy ran (at once, but for a stream running four micro-batches
    /// behind); with NCCL peers, watched as the stream's waits are ([`CudaDevice::drain`]), so
    /// that a rank stuck in a sum does not hang this one's host here.
    fn wait_copied(&self, event: &CudaEvent) {
        if matches!(event.try_is_complete(), Ok(true)) {
            return;
        }
        let watch = self.watch.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(w) = watch {
            // SAFETY: the event is alive while `event` is.
            self.watched_query("an upload of token ids", &w, || unsafe {
                drv_sys::cuEventQuery(event.cu_event())
            });
        }
        if let Err(e) = event.synchronize() {
            self.record("an upload of token ids", e);
        }
    }
}
