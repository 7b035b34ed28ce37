//! The side stream ([`Device::aside`]): the weight gradients' GEMMs and the column sums beside
//! the compute stream's critical path, and each step's parameter updates beside the next
//! forward ([`Device::update_aside`]); tickets and events order the two streams
//! (docs/cuda.md, "GEMMs" and "The step beside the forward").

use super::*;

/// The priority of the compute and copy streams when the side stream runs behind them
/// ([`SideStream::Behind`]): above the default 0 (a lower number is a higher priority; CUDA
/// clamps a value outside the device's range, `cuCtxGetStreamPriorityRange`, to it).
pub(super) const AHEAD: i32 = -1;

/// The second stream of [`Device::aside`]'s work, with a cuBLASLt workspace of its own (two
/// GEMMs running at once must not share one; cuBLAS's documentation asks the same of a handle
/// used on several streams for its results to be reproducible), both made when the GPU opens:
/// nothing is allocated in the step loop or in a capture.
pub(super) struct Side {
    pub(super) stream: Arc<CudaStream>,
    pub(super) workspace: CudaSlice<u8>,
    /// Inside a [`Device::aside`] call: its work may go to the side stream. Outside one (every
    /// forward kernel), a launch reads this flag and takes no lock.
    pub(super) open: std::sync::atomic::AtomicBool,
    pub(super) state: Mutex<SideState>,
    /// [`Device::update_aside`]'s event of each parameter segment, made at its first use and
    /// then recorded again at each update: a graph captured with a wait on it
    /// ([`Device::wait_update`]) waits on its latest record at every replay.
    pub(super) updates: Mutex<Vec<Option<CudaEvent>>>,
    /// The event [`CudaDevice::side_lane`] orders the side stream after the compute stream with
    /// outside a capture, recorded again at each join (a wait waits for the record before it),
    /// where cudarc's `join` makes and destroys an event each time: two driver calls a join,
    /// not four, on the host's path of a step's updates.
    pub(super) join: CudaEvent,
}

/// What [`Side`]'s stream holds that the compute stream has not waited for.
pub(super) struct SideState {
    /// A GEMM or kernel of the open call went there.
    pub(super) used: bool,
    /// Work went there since the compute stream last waited for all of it.
    pub(super) pending: bool,
    /// Each ticket's event (ticket `i + 1`), recorded on the side stream after its call's
    /// work; cleared when the compute stream waits for everything.
    pub(super) events: Vec<cudarc::driver::CudaEvent>,
    /// The ticket of `events[0]`: tickets count from 1 ([`Aside::DONE`] is 0).
    pub(super) first: usize,
    /// Inside [`Device::updates_aside`]: whether its work has joined the compute stream already
    /// (`Some(true)`: no launch of it joins again; nothing else is queued meanwhile). `None`
    /// outside one.
    pub(super) updates_joined: Option<bool>,
}

impl Default for SideState {
    fn default() -> SideState {
        SideState {
            used: false,
            pending: false,
            events: Vec::new(),
            first: 1,
            updates_joined: None,
        }
    }
}

impl CudaDevice {
    /// The side stream for a kernel, or a GEMM that reads its operands as they are (`direct`),
    /// inside an open [`Device::aside`] call, ordered after everything queued on the compute
    /// stream so far (an event it waits for). `None`: no side stream, no open call, or a
    /// profile, whose events time the compute stream's operations one after another.
    pub(super) fn side_lane(&self, direct: bool) -> Option<&Side> {
        use std::sync::atomic::Ordering::Relaxed;
        let side = self.side.as_ref()?;
        if !direct || !side.open.load(Relaxed) || self.profiling.load(Relaxed) {
            return None;
        }
        let mut st = side.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.updates_joined != Some(true) {
            // Inside a capture a fresh event, as the capture's fork (once per captured pass).
            let joined = if self.capturing() {
                side.stream.join(&self.stream)
            } else {
                side.join
                    .record(&self.stream)
                    .and_then(|()| side.stream.wait(&side.join))
            };
            if let Err(e) = joined {
                self.record("ordering work on the side stream", e);
                return None;
            }
            if st.updates_joined.is_some() {
                st.updates_joined = Some(true);
            }
        }
        st.used = true;
        st.pending = true;
        Some(side)
    }

    /// [`Device::updates_aside`] on this GPU: `f`'s side work joins the compute stream at its
    /// first launch only.
    pub(super) fn run_updates_aside(&self, f: impl FnOnce()) {
        let Some(side) = self.side.as_ref().filter(|_| self.step_aside) else {
            f();
            return;
        };
        let set = |v: Option<bool>| {
            side.state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .updates_joined = v;
        };
        set(Some(false));
        f();
        set(None);
    }

    /// Runs `f` with the side stream open to its launches ([`CudaDevice::side_lane`]): whether
    /// any went there, for the caller to mark. False inside an open call (whose mark covers
    /// `f`'s work) and when nothing went aside (profiling, a failed device: in order with the
    /// rest).
    pub(super) fn open_side(&self, side: &Side, f: impl FnOnce()) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if side.open.swap(true, Relaxed) {
            f();
            return false;
        }
        side.state.lock().unwrap_or_else(|p| p.into_inner()).used = false;
        f();
        side.open.store(false, Relaxed);
        side.state.lock().unwrap_or_else(|p| p.into_inner()).used
    }

    /// `f` on segment `seg`'s event of [`Device::update_aside`], made at its first use.
    pub(super) fn on_update_event(
        &self,
        side: &Side,
        seg: usize,
        f: impl FnOnce(&CudaEvent) -> Result<(), cudarc::driver::DriverError>,
    ) -> Result<(), cudarc::driver::DriverError> {
        let mut all = side.updates.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() <= seg {
            all.resize_with(seg + 1, || None);
        }
        if all[seg].is_none() {
            all[seg] = Some(self.ctx.new_event(None)?);
        }
        f(all[seg].as_ref().expect("made above"))
    }

    /// [`Device::aside`] on this GPU.
    pub(super) fn run_aside(&self, f: impl FnOnce()) -> Aside {
        let Some(side) = &self.side else {
            f();
            return Aside::DONE;
        };
        if !self.open_side(side, f) {
            return Aside::DONE;
        }
        let mut st = side.state.lock().unwrap_or_else(|p| p.into_inner());
        match side.stream.record_event(None) {
            Ok(e) => {
                st.events.push(e);
                Aside(st.first + st.events.len() - 1)
            }
            Err(e) => {
                drop(st);
                self.record("marking the side stream's work", e);
                self.join_aside();
                Aside::DONE
            }
        }
    }

    /// [`Device::wait_aside`] on this GPU.
    pub(super) fn run_wait_aside(&self, t: Aside) {
        let Some(side) = &self.side else {
            return;
        };
        let st = side.state.lock().unwrap_or_else(|p| p.into_inner());
        // A ticket before `first` was joined already.
        let Some(e) = t.0.checked_sub(st.first).and_then(|i| st.events.get(i)) else {
            return;
        };
        if let Err(e) = self.stream.wait(e) {
            drop(st);
            self.record("waiting for the side stream's work", e);
        }
    }

    /// [`Device::update_aside`] on this GPU.
    pub(super) fn run_update_aside(&self, seg: usize, f: impl FnOnce()) {
        let Some(side) = self.side.as_ref().filter(|_| self.step_aside) else {
            f();
            return;
        };
        if !self.open_side(side, f) {
            return;
        }
        let recorded = self.on_update_event(side, seg, |e| e.record(&side.stream));
        if let Err(e) = recorded {
            self.record("marking a parameter segment's update", e);
            self.join_aside();
        }
    }

    /// [`Device::wait_update`] on this GPU.
    pub(super) fn run_wait_update(&self, seg: usize) {
        let Some(side) = self.side.as_ref().filter(|_| self.step_aside) else {
            return;
        };
        let capturing = self.capturing();
        let waited = self.on_update_event(side, seg, |e| {
            if !capturing {
                return self.stream.wait(e);
            }
            // In a capture the wait is the graph's own node, on the event's latest record
            // at each replay (an event recorded outside a capture may not be waited on
            // otherwise: CUDA_ERROR_STREAM_CAPTURE_ISOLATION). A wait on an event never
            // recorded waits for nothing.
            self.bind();
            // SAFETY: the stream and the event are this device's, alive while `self` is.
            unsafe {
                drv_sys::cuStreamWaitEvent(
                    self.stream.cu_stream(),
                    e.cu_event(),
                    drv_sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32,
                )
                .result()
            }
        });
        if let Err(e) = waited {
            self.record("waiting for a parameter segment's update", e);
        }
    }

    /// [`Device::join_aside`] on this GPU.
    pub(super) fn run_join_aside(&self) {
        let Some(side) = &self.side else {
            return;
        };
        let mut st = side.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.pending {
            return;
        }
        st.pending = false;
        st.first += st.events.len();
        st.events.clear();
        if let Err(e) = self.stream.join(&side.stream) {
            drop(st);
            self.record("joining the side stream", e);
        }
    }
}
