//! [`crate::backend::device::Device::profile`]'s timing on a GPU: events around each operation.

use std::sync::Arc;

use cudarc::driver::{sys as drv_sys, CudaContext, CudaEvent};

use crate::backend::profile::Profile;

/// [`Device::profile`] on a GPU: every operation on the stream between two events, whose
/// elapsed time is read once the GPU has passed them (at a synchronisation, or after
/// [`Timer::LIMIT`] operations), then the events are reused.
pub(super) struct Timer {
    pub(super) pending: Vec<(&'static str, CudaEvent, CudaEvent)>,
    pub(super) free: Vec<CudaEvent>,
    pub(super) profile: Profile,
    /// The first operation's start: the profile's span runs from it to the latest end.
    pub(super) first: Option<CudaEvent>,
}

impl Timer {
    /// Operations kept pending before the oldest are read (a wait for the GPU to reach them).
    pub(super) const LIMIT: usize = 8192;

    /// A timing event (a new one when none is free); `None` when the driver would not make one.
    pub(super) fn event(&mut self, ctx: &Arc<CudaContext>) -> Option<CudaEvent> {
        self.free.pop().or_else(|| {
            ctx.new_event(Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT))
                .ok()
        })
    }

    /// Adds every pending operation's time to the profile (waiting for the GPU to finish
    /// them); an event the driver cannot time is skipped.
    pub(super) fn resolve(&mut self) {
        let mut last = None;
        for (name, start, end) in self.pending.drain(..) {
            if let Ok(ms) = start.elapsed_ms(&end) {
                self.profile.add(name, f64::from(ms) / 1e3);
            }
            match self.first {
                None => self.first = Some(start),
                Some(_) => self.free.push(start),
            }
            // The stream runs them in order: the last end is the latest.
            if let Some(before) = last.replace(end) {
                self.free.push(before);
            }
        }
        if let Some(end) = last {
            if let Some(Ok(ms)) = self.first.as_ref().map(|f| f.elapsed_ms(&end)) {
                self.profile.span = self.profile.span.max(f64::from(ms) / 1e3);
            }
            self.free.push(end);
        }
    }
}
