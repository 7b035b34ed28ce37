//! The driver API (`libcuda.so`): devices and contexts, memory, streams, events, kernels (run
//! by runtime/emu) and graphs (stream capture), with the refusals the crate docs list.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

use crate::{code, complain, current, enqueue, set_current, state, Alloc, Capture, Event, Op};

/// A context handle: the device, offset so that no handle is null.
fn ctx_handle(device: i32) -> *mut c_void {
    (0xC000 + 16 * (device as usize + 1)) as *mut c_void
}

fn ctx_device(ctx: *mut c_void) -> Option<i32> {
    let h = ctx as usize;
    (h > 0xC000 && (h - 0xC000) % 16 == 0)
        .then(|| ((h - 0xC000) / 16) as i32 - 1)
        .filter(|d| (0..crate::devices()).contains(d))
}

/// The name that says what this device is, unless `RECIPE_FAKE_CUDA_NAME` gives another (a
/// real GPU's, to test what `recipe` does with it: its peak for the run's MFU, runtime/src/flops.rs).
const NAME: &str = "recipe fake GPU (CPU emulation, runtime/fake-cuda)";

#[no_mangle]
pub unsafe extern "C" fn cuInit(_flags: c_uint) -> c_int {
    code::SUCCESS
}

/// CUDA 13.0, which the runtime requires.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> c_int {
    *v = 13000;
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> c_int {
    *n = crate::devices();
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> c_int {
    if !(0..crate::devices()).contains(&ordinal) {
        return code::INVALID_DEVICE;
    }
    *dev = ordinal;
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> c_int {
    if !(0..crate::devices()).contains(&dev) {
        return code::INVALID_DEVICE;
    }
    let given = std::env::var("RECIPE_FAKE_CUDA_NAME").unwrap_or_else(|_| NAME.into());
    let text = CString::new(given.replace('\0', "")).expect("no NUL");
    let bytes = text.as_bytes_with_nul();
    let n = bytes.len().min(len.max(0) as usize);
    std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, name, n);
    if n > 0 {
        *name.add(n - 1) = 0;
    }
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> c_int {
    if !(0..crate::devices()).contains(&dev) {
        return code::INVALID_DEVICE;
    }
    *bytes = crate::memory_per_device();
    code::SUCCESS
}

/// An H100/H200's figures (sm_90) for what a program may ask.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_uint, dev: c_int) -> c_int {
    if !(0..crate::devices()).contains(&dev) {
        return code::INVALID_DEVICE;
    }
    *pi = match attrib {
        1..=3 => 1024,    // max threads per block, block x and y
        4 => 64,          // block z
        5 => i32::MAX,    // grid x
        6 | 7 => 65535,   // grid y, z
        8 => 48 * 1024,   // shared memory per block
        10 => 32,         // warp size
        13 => 1_980_000,  // clock, kHz
        16 => 132,        // multiprocessors
        38 => 50 << 20,   // L2
        39 => 2048,       // threads per multiprocessor
        41 => 1,          // unified addressing
        75 => 9,          // compute capability
        76 => 0,          //
        97 => 227 * 1024, // opt-in shared memory per block
        115 => 1,         // memory pools (cuMemAllocAsync)
        _ => 0,
    };
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> c_int {
    if !(0..crate::devices()).contains(&dev) {
        return code::INVALID_DEVICE;
    }
    *ctx = ctx_handle(dev);
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> c_int {
    if !(0..crate::devices()).contains(&dev) {
        return code::INVALID_DEVICE;
    }
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> c_int {
    if ctx.is_null() {
        set_current(None);
        return code::SUCCESS;
    }
    match ctx_device(ctx) {
        Some(d) => {
            set_current(Some(d));
            code::SUCCESS
        }
        None => code::INVALID_CONTEXT,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> c_int {
    *ctx = match current() {
        Some(d) => ctx_handle(d),
        None => std::ptr::null_mut(),
    };
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> c_int {
    match current() {
        Some(d) => {
            *dev = d;
            code::SUCCESS
        }
        None => code::INVALID_CONTEXT,
    }
}

/// Synchronising the context: everything already ran, but not allowed while this thread
/// captures.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> c_int {
    sync_point("cuCtxSynchronize", None)
}

/// A host wait: the device's sticky error, or a refusal (which invalidates the capture) when
/// the calling thread captures or `stream` is being captured.
fn sync_point(what: &str, stream: Option<usize>) -> c_int {
    let mut st = state();
    let Some(d) = current() else {
        return code::INVALID_CONTEXT;
    };
    if let Some(id) = stream.and_then(|s| st.capture_of(s)) {
        st.invalidate(id, &format!("{what} on a stream being captured"));
        return code::STREAM_CAPTURE_UNSUPPORTED;
    }
    if let Some(id) = st.strict_capture_here() {
        st.invalidate(id, &format!("{what} while this thread captures"));
        return code::STREAM_CAPTURE_UNSUPPORTED;
    }
    drop(st);
    crate::streams::drain(d, stream);
    state().sticky.get(&d).copied().unwrap_or(code::SUCCESS)
}

// ---- memory ----

/// A new allocation, filled with 0xFF bytes (NaN in every float type the runtime uses), so that
/// reading memory nothing wrote shows.
fn allocate(device: i32, bytes: usize) -> Result<u64, c_int> {
    let mut st = state();
    // A faulted context fails every call, allocations included.
    if let Some(&e) = st.sticky.get(&device) {
        return Err(e);
    }
    let used = st.used.get(&device).copied().unwrap_or(0);
    if used + bytes > crate::memory_per_device() {
        return Err(code::OUT_OF_MEMORY);
    }
    let layout =
        std::alloc::Layout::from_size_align(bytes.max(1), 256).map_err(|_| code::INVALID_VALUE)?;
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        return Err(code::OUT_OF_MEMORY);
    }
    // SAFETY: `p` has `layout.size()` bytes.
    unsafe { std::ptr::write_bytes(p, 0xFF, layout.size()) };
    *st.used.entry(device).or_default() += bytes;
    st.stats.allocations += 1;
    st.allocs.insert(
        p as u64,
        Alloc {
            size: bytes,
            device,
            layout,
        },
    );
    Ok(p as u64)
}

fn release(ptr: u64, what: &str) -> c_int {
    match current() {
        Some(d) => release_on(d, ptr, what),
        None => code::INVALID_CONTEXT,
    }
}

/// Frees `ptr`, which `d`'s context frees.
fn release_on(d: i32, ptr: u64, what: &str) -> c_int {
    let mut st = state();
    let Some(a) = st.allocs.remove(&ptr) else {
        complain(
            what,
            &format!("{ptr:#x} is not a live allocation (freed twice, or never allocated)"),
        );
        return code::INVALID_VALUE;
    };
    if a.device != d {
        complain(
            what,
            &format!(
                "{ptr:#x} belongs to GPU {}, freed from GPU {d}'s context",
                a.device
            ),
        );
    }
    *st.used.entry(a.device).or_default() -= a.size;
    // Freed memory is kept a while (the last 256 MiB freed) before it goes back to the host
    // allocator, so that its addresses are not handed out again at once: a stale graph or
    // queued operation still pointing there then fails its range check, instead of passing by
    // chance on a new allocation at the same address.
    st.graveyard.push_back((ptr, a.layout));
    st.buried += a.layout.size();
    while st.buried > 256 << 20 {
        let Some((p, layout)) = st.graveyard.pop_front() else {
            break;
        };
        st.buried -= layout.size();
        // SAFETY: allocated by `allocate` with this layout, removed from the table once and
        // released from the graveyard once.
        unsafe { std::alloc::dealloc(p as *mut u8, layout) };
    }
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) -> c_int {
    let Some(d) = current() else {
        return code::INVALID_CONTEXT;
    };
    let capture = state().strict_capture_here();
    if let Some(id) = capture {
        state().invalidate(id, "cuMemAlloc while this thread captures");
        return code::STREAM_CAPTURE_UNSUPPORTED;
    }
    match allocate(d, bytes) {
        Ok(p) => {
            *dptr = p;
            code::SUCCESS
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: u64) -> c_int {
    let capture = state().strict_capture_here();
    if let Some(id) = capture {
        state().invalidate(id, "cuMemFree while this thread captures");
        return code::STREAM_CAPTURE_UNSUPPORTED;
    }
    // cuMemFree waits for the device first.
    if let Some(d) = current() {
        crate::streams::drain(d, None);
    }
    release(dptr, "cuMemFree")
}

/// Stream-ordered allocation: at once (every earlier operation already ran). On a stream being
/// captured it would become a graph's own allocation, which the runtime never wants (its
/// buffers outlive the graph's launches): refused.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, bytes: usize, stream: usize) -> c_int {
    let device = {
        let mut st = state();
        if let Some(id) = st.capture_of(stream) {
            st.invalidate(
                id,
                "cuMemAllocAsync on a stream being captured (a graph-owned allocation; the runtime allocates outside captures)",
            );
            return code::STREAM_CAPTURE_UNSUPPORTED;
        }
        match crate::stream_device(&st, stream) {
            Some(d) => d,
            None => return code::INVALID_HANDLE,
        }
    };
    match allocate(device, bytes) {
        Ok(p) => {
            *dptr = p;
            code::SUCCESS
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: u64, stream: usize) -> c_int {
    {
        let mut st = state();
        if let Some(id) = st.capture_of(stream) {
            st.invalidate(id, "cuMemFreeAsync on a stream being captured");
            return code::STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    // In stream order: after what the stream queued before it.
    let Some(device) = crate::device_of(stream) else {
        return code::INVALID_HANDLE;
    };
    if crate::streams::delay().is_some() {
        let op: Op = Arc::new(move || match release_on(device, dptr, "cuMemFreeAsync") {
            code::SUCCESS => Ok(()),
            e => Err(format!("freeing {dptr:#x} failed ({e})")),
        });
        return enqueue(stream, "cuMemFreeAsync", op);
    }
    release_on(device, dptr, "cuMemFreeAsync")
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> c_int {
    let Some(d) = current() else {
        return code::INVALID_CONTEXT;
    };
    let all = crate::memory_per_device();
    *total = all;
    *free = all - state().used.get(&d).copied().unwrap_or(0);
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    _flags: c_uint,
) -> c_int {
    let Ok(layout) = std::alloc::Layout::from_size_align(bytes.max(1), 4096) else {
        return code::INVALID_VALUE;
    };
    let p = std::alloc::alloc(layout);
    if p.is_null() {
        return code::OUT_OF_MEMORY;
    }
    std::ptr::write_bytes(p, 0xFF, layout.size());
    state().hosts.insert(p as u64, layout);
    *pp = p as *mut c_void;
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> c_int {
    let Some(layout) = state().hosts.remove(&(p as u64)) else {
        complain(
            "cuMemFreeHost",
            &format!("{p:?} is not a live pinned allocation"),
        );
        return code::INVALID_VALUE;
    };
    std::alloc::dealloc(p as *mut u8, layout);
    code::SUCCESS
}

/// A copy as a queued operation; `dst_dev`/`src_dev` say which side is device memory (checked
/// when it runs).
fn copy_op(
    stream: usize,
    what: &'static str,
    dst: u64,
    src: u64,
    n: usize,
    dst_dev: bool,
    src_dev: bool,
) -> c_int {
    let Some(device) = crate::device_of(stream) else {
        return code::INVALID_HANDLE;
    };
    // Pageable host memory (not from cuMemHostAlloc): the driver stages a source before the
    // call returns, and returns from a copy into it once the copy is done (the CUDA runtime
    // API's "API synchronization behavior"), which matters with asynchronous streams.
    let (pinned, capturing) = {
        let st = state();
        (
            (dst_dev || st.pinned(dst, n), src_dev || st.pinned(src, n)),
            st.capture_of(stream).is_some(),
        )
    };
    if dst_dev && !src_dev && !pinned.1 && !capturing && crate::streams::behind(device, stream) {
        let mut st = state();
        st.stats.pageable_uploads_behind += 1;
        st.stats.save();
    }
    let staged = (crate::streams::delay().is_some() && !capturing && !pinned.1 && n > 0)
        // SAFETY: the caller's host range, read now as the driver would stage it.
        .then(|| Arc::new(unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec()));
    let wait = crate::streams::delay().is_some() && !capturing && !pinned.0;
    let host_pinned = (!dst_dev && pinned.0, !src_dev && pinned.1);
    let op: Op = Arc::new(move || {
        let src = staged.as_ref().map_or(src, |v| v.as_ptr() as u64);
        {
            let st = state();
            // Pinned host memory must outlive the queued copies that use it.
            let freed = |p: u64| !st.pinned(p, n);
            if (host_pinned.0 && freed(dst)) || (host_pinned.1 && staged.is_none() && freed(src)) {
                return Err("a pinned host buffer freed before its queued copy ran".into());
            }
            if dst_dev {
                st.check_range(device, dst, n)
                    .map_err(|e| format!("destination: {e}"))?;
            }
            if src_dev {
                st.check_range(device, src, n)
                    .map_err(|e| format!("source: {e}"))?;
            }
        }
        if n > 0 {
            // SAFETY: device ranges checked above; host ranges are the caller's promise, as
            // with a real driver. `copy` allows an overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
        }
        Ok(())
    });
    let r = enqueue(stream, what, op);
    if wait && r == code::SUCCESS {
        crate::streams::drain(device, Some(stream));
        return state()
            .sticky
            .get(&device)
            .copied()
            .unwrap_or(code::SUCCESS);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: usize,
) -> c_int {
    copy_op(stream, "cuMemcpyHtoDAsync", dst, src as u64, n, true, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: usize,
) -> c_int {
    copy_op(stream, "cuMemcpyDtoHAsync", dst as u64, src, n, false, true)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: u64,
    src: u64,
    n: usize,
    stream: usize,
) -> c_int {
    copy_op(stream, "cuMemcpyDtoDAsync", dst, src, n, true, true)
}

/// The synchronous copies: the legacy stream, then a host wait.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> c_int {
    let r = copy_op(0, "cuMemcpyHtoD", dst, src as u64, n, true, false);
    if r != code::SUCCESS {
        r
    } else {
        sync_point("cuMemcpyHtoD", Some(0))
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> c_int {
    let r = copy_op(0, "cuMemcpyDtoH", dst as u64, src, n, false, true);
    if r != code::SUCCESS {
        r
    } else {
        sync_point("cuMemcpyDtoH", Some(0))
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) -> c_int {
    let r = copy_op(0, "cuMemcpyDtoD", dst, src, n, true, true);
    if r != code::SUCCESS {
        r
    } else {
        sync_point("cuMemcpyDtoD", Some(0))
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(dst: u64, value: u8, n: usize, stream: usize) -> c_int {
    let Some(device) = crate::device_of(stream) else {
        return code::INVALID_HANDLE;
    };
    let op: Op = Arc::new(move || {
        state().check_range(device, dst, n)?;
        // SAFETY: checked above.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
        Ok(())
    });
    enqueue(stream, "cuMemsetD8Async", op)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: u64, value: u8, n: usize) -> c_int {
    let r = cuMemsetD8Async(dst, value, n, 0);
    if r != code::SUCCESS {
        r
    } else {
        sync_point("cuMemsetD8", Some(0))
    }
}

// ---- streams and events ----

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(out: *mut usize, _flags: c_uint) -> c_int {
    let Some(d) = current() else {
        return code::INVALID_CONTEXT;
    };
    let mut st = state();
    let h = st.handle();
    st.streams.insert(
        h,
        crate::Stream {
            device: d,
            ..Default::default()
        },
    );
    *out = h;
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    out: *mut usize,
    flags: c_uint,
    _priority: c_int,
) -> c_int {
    cuStreamCreate(out, flags)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: usize) -> c_int {
    let mut st = state();
    match st.streams.get(&stream) {
        None => code::INVALID_HANDLE,
        Some(s) if s.capture.is_some() => {
            complain("cuStreamDestroy", "a stream being captured");
            code::STREAM_CAPTURE_UNSUPPORTED
        }
        Some(_) => {
            st.streams.remove(&stream);
            code::SUCCESS
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: usize) -> c_int {
    sync_point("cuStreamSynchronize", Some(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(stream: usize) -> c_int {
    let Some(d) = crate::device_of(stream) else {
        return code::INVALID_HANDLE;
    };
    if !crate::streams::idle(d, stream) {
        return code::NOT_READY;
    }
    sync_point("cuStreamQuery", Some(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(out: *mut usize, _flags: c_uint) -> c_int {
    let Some(d) = current() else {
        return code::INVALID_CONTEXT;
    };
    let mut st = state();
    let h = st.handle();
    st.events.insert(
        h,
        Event {
            device: d,
            ..Default::default()
        },
    );
    *out = h;
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: usize) -> c_int {
    match state().events.remove(&event) {
        Some(_) => code::SUCCESS,
        None => code::INVALID_HANDLE,
    }
}

/// Recording: in a capture, the event marks the stream's place in it (a stream that waits on
/// it joins the capture); otherwise it is reached at once (everything queued already ran).
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: usize, stream: usize) -> c_int {
    let mut st = state();
    let capture = st.capture_of(stream);
    let recorded = st.streams.get(&stream).map_or(0, |s| s.recorded);
    let Some(e) = st.events.get_mut(&event) else {
        return code::INVALID_HANDLE;
    };
    e.pending = None;
    match capture {
        Some(id) => {
            e.captured = Some((id, stream, recorded));
            e.at = None;
        }
        None => {
            e.captured = None;
            e.at = Some(std::time::Instant::now());
            let device = e.device;
            // Asynchronous streams: reached (and timed) when the stream gets there.
            if let Some(w) = crate::streams::worker(device, stream) {
                e.at = None;
                e.pending = Some((w.clone(), w.queued() + 1));
                drop(st);
                let stamp: Op = Arc::new(move || {
                    if let Some(e) = state().events.get_mut(&event) {
                        e.at = Some(std::time::Instant::now());
                    }
                    Ok(())
                });
                crate::streams::push(device, stream, "cuEventRecord", &stamp);
            }
        }
    }
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    event: usize,
    stream: usize,
    _flags: c_uint,
) -> c_int {
    cuEventRecord(event, stream)
}

/// A wait on an event recorded in a capture joins `stream` to that capture (or, on a stream of
/// the capture, marks the recording stream as joined back up to that point).
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(stream: usize, event: usize, flags: c_uint) -> c_int {
    let mut st = state();
    let Some(e) = st.events.get(&event).cloned() else {
        return code::INVALID_HANDLE;
    };
    // A capturing stream may not depend on work outside the capture (an event recorded
    // outside it), unless the wait is external (CU_EVENT_WAIT_EXTERNAL, 1).
    let outside = e.captured.is_none() && (e.at.is_some() || e.pending.is_some());
    if let (true, Some(id), 0) = (outside, st.capture_of(stream), flags & 1) {
        st.invalidate(
            id,
            "a capturing stream waits on an event recorded outside the capture",
        );
        return code::STREAM_CAPTURE_ISOLATION;
    }
    if let (Some(_), None, 1) = (st.capture_of(stream), e.captured, flags & 1) {
        // An external wait in a capture is the graph's node: each replay's stream waits there
        // for the event's latest record (made outside any capture; one never recorded, or
        // reached already, waits for nothing).
        st.stats.external_waits += 1;
        st.stats.save();
        drop(st);
        let op: Op = Arc::new(move || {
            let pending = state().events.get(&event).and_then(|e| e.pending.clone());
            if let Some((w, at)) = pending {
                w.wait(at);
            }
            Ok(())
        });
        return enqueue(stream, "cuStreamWaitEvent (external)", op);
    }
    let Some((id, from, count)) = e.captured else {
        // Work outside any capture: on asynchronous streams this stream's next operations
        // wait until the recording stream has reached the event.
        let (Some((w, at)), None) = (e.pending, st.capture_of(stream)) else {
            return code::SUCCESS;
        };
        drop(st);
        let op: Op = Arc::new(move || {
            w.wait(at);
            Ok(())
        });
        return enqueue(stream, "cuStreamWaitEvent", op);
    };
    if !st.captures.contains_key(&id) {
        // The capture it was recorded in has ended: waiting on it outside is an error.
        complain(
            "cuStreamWaitEvent",
            "an event recorded in a capture that has ended",
        );
        return code::STREAM_CAPTURE_ISOLATION;
    }
    match st.capture_of(stream) {
        Some(mine) if mine != id => {
            complain("cuStreamWaitEvent", "joins two captures");
            code::STREAM_CAPTURE_ISOLATION
        }
        Some(_) => {
            if let Some(s) = st.streams.get_mut(&from) {
                s.joined_back = s.joined_back.max(count);
            }
            code::SUCCESS
        }
        None => {
            if stream == 0 {
                st.invalidate(id, "the legacy stream joins a capture");
                return code::STREAM_CAPTURE_IMPLICIT;
            }
            let Some(s) = st.streams.get_mut(&stream) else {
                return code::INVALID_HANDLE;
            };
            s.capture = Some(id);
            s.recorded = 0;
            s.joined_back = 0;
            code::SUCCESS
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: usize) -> c_int {
    event_wait("cuEventSynchronize", event)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(event: usize) -> c_int {
    event_wait("cuEventQuery", event)
}

fn event_wait(what: &str, event: usize) -> c_int {
    let st = state();
    let Some(e) = st.events.get(&event) else {
        return code::INVALID_HANDLE;
    };
    if e.captured.is_some() {
        complain(
            what,
            "an event recorded in a capture, waited on by the host",
        );
        return code::CAPTURED_EVENT;
    }
    let (device, pending) = (e.device, e.pending.clone());
    if let Some(id) = st.strict_capture_here() {
        drop(st);
        state().invalidate(id, &format!("{what} while this thread captures"));
        return code::STREAM_CAPTURE_UNSUPPORTED;
    }
    drop(st);
    if let Some((w, at)) = pending {
        if what == "cuEventQuery" && !w.reached(at) {
            return code::NOT_READY;
        }
        w.wait(at);
    }
    state()
        .sticky
        .get(&device)
        .copied()
        .unwrap_or(code::SUCCESS)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: usize, end: usize) -> c_int {
    let st = state();
    let (Some(a), Some(b)) = (st.events.get(&start), st.events.get(&end)) else {
        return code::INVALID_HANDLE;
    };
    match (a.at, b.at) {
        (Some(a), Some(b)) => {
            *ms = b.saturating_duration_since(a).as_secs_f32() * 1e3;
            code::SUCCESS
        }
        _ => code::INVALID_HANDLE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: usize, end: usize) -> c_int {
    cuEventElapsedTime(ms, start, end)
}

// ---- capture and graphs ----

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: usize, mode: c_uint) -> c_int {
    let mut st = state();
    if stream == 0 {
        complain(
            "cuStreamBeginCapture",
            "the legacy default stream cannot be captured",
        );
        return code::STREAM_CAPTURE_UNSUPPORTED;
    }
    if st.sticky.contains_key(&current().unwrap_or(-1)) {
        return code::ILLEGAL_ADDRESS;
    }
    let id = st.handle();
    let Some(s) = st.streams.get_mut(&stream) else {
        return code::INVALID_HANDLE;
    };
    if s.capture.is_some() {
        complain(
            "cuStreamBeginCapture",
            "the stream is already being captured",
        );
        return code::ILLEGAL_STATE;
    }
    s.capture = Some(id);
    s.recorded = 0;
    s.joined_back = 0;
    st.captures.insert(
        id,
        Capture {
            origin: stream,
            thread: Some(std::thread::current().id()),
            // CU_STREAM_CAPTURE_MODE_RELAXED is 2.
            strict: mode != 2,
            ..Default::default()
        },
    );
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: usize, status: *mut c_uint) -> c_int {
    let st = state();
    *status = match st.capture_of(stream) {
        None => 0,
        Some(id)
            if st
                .captures
                .get(&id)
                .is_some_and(|c| c.invalidated.is_some()) =>
        {
            2
        }
        Some(_) => 1,
    };
    code::SUCCESS
}

/// Ends the capture begun on `stream`: every stream that joined it must have been joined back
/// (waited for by a stream of the capture after its last recorded operation).
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: usize, graph: *mut usize) -> c_int {
    let mut st = state();
    let Some(id) = st.capture_of(stream) else {
        complain("cuStreamEndCapture", "the stream is not being captured");
        return code::ILLEGAL_STATE;
    };
    if st
        .captures
        .get(&id)
        .is_some_and(|c| c.strict && c.thread != Some(std::thread::current().id()))
    {
        complain(
            "cuStreamEndCapture",
            "ended on another thread than began it",
        );
        return code::STREAM_CAPTURE_WRONG_THREAD;
    }
    if st.captures.get(&id).map(|c| c.origin) != Some(stream) {
        complain("cuStreamEndCapture", "not the stream the capture began on");
        return code::STREAM_CAPTURE_UNMATCHED;
    }
    let mut unjoined = false;
    for (h, s) in st.streams.iter_mut() {
        if s.capture == Some(id) {
            if *h != stream && s.recorded > s.joined_back {
                unjoined = true;
            }
            s.capture = None;
        }
    }
    let c = st.captures.remove(&id).expect("checked above");
    // Events recorded in it can no longer be waited on as part of it.
    for e in st.events.values_mut() {
        if e.captured.is_some_and(|(cid, ..)| cid == id) {
            e.captured = None;
        }
    }
    if unjoined {
        complain(
            "cuStreamEndCapture",
            "a stream forked into the capture was not joined back",
        );
        return code::STREAM_CAPTURE_UNJOINED;
    }
    if let Some(why) = c.invalidated {
        let _ = why; // said when it happened
        return code::STREAM_CAPTURE_INVALIDATED;
    }
    let h = st.handle();
    st.graphs.insert(h, c.ops);
    st.stats.captures += 1;
    st.stats.save();
    *graph = h;
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut usize,
    graph: usize,
    _flags: u64,
) -> c_int {
    let mut st = state();
    let Some(ops) = st.graphs.get(&graph).cloned() else {
        return code::INVALID_HANDLE;
    };
    let h = st.handle();
    st.graphs.insert(h, ops);
    *exec = h;
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: usize, _stream: usize) -> c_int {
    if state().graphs.contains_key(&exec) {
        code::SUCCESS
    } else {
        code::INVALID_HANDLE
    }
}

/// Runs the graph's operations in the order they were captured (a valid order of its
/// dependencies), or records them into a capture in progress.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: usize, stream: usize) -> c_int {
    let ops = {
        let mut st = state();
        let Some(ops) = st.graphs.get(&exec).cloned() else {
            return code::INVALID_HANDLE;
        };
        st.stats.graph_launches += 1;
        st.stats.save();
        ops
    };
    for op in ops {
        let r = enqueue(stream, "a graph's operation", op);
        if r != code::SUCCESS {
            return r;
        }
    }
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: usize) -> c_int {
    match state().graphs.remove(&exec) {
        Some(_) => code::SUCCESS,
        None => code::INVALID_HANDLE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: usize) -> c_int {
    cuGraphExecDestroy(graph)
}

// ---- modules and kernels ----

/// The kernels the emulator was built with: name and parameter letters (`p` pointer, `i`
/// int, `u` unsigned, `U` unsigned long long, `f` float).
fn kernels() -> &'static [(CString, CString)] {
    static K: OnceLock<Vec<(CString, CString)>> = OnceLock::new();
    K.get_or_init(|| {
        recipe_kernel_emu::kernel_signatures()
            .into_iter()
            .map(|(n, s)| {
                (
                    CString::new(n).expect("name"),
                    CString::new(s).expect("letters"),
                )
            })
            .collect()
    })
}

/// A module is the fake NVRTC's image ([`crate::nvrtc::IMAGE`]); anything else is refused.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut usize, image: *const c_void) -> c_int {
    if current().is_none() {
        return code::INVALID_CONTEXT;
    }
    let magic = crate::nvrtc::IMAGE;
    let bytes = std::slice::from_raw_parts(image as *const u8, magic.len());
    if bytes != magic {
        complain("cuModuleLoadData", "not an image from this library's NVRTC");
        return code::INVALID_IMAGE;
    }
    *module = state().handle();
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(_module: usize) -> c_int {
    code::SUCCESS
}

/// A function handle is its index in [`kernels`], plus one.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut usize,
    _module: usize,
    name: *const c_char,
) -> c_int {
    let name = CStr::from_ptr(name);
    match kernels().iter().position(|(n, _)| n.as_c_str() == name) {
        Some(i) => {
            *f = i + 1;
            code::SUCCESS
        }
        None => code::NOT_FOUND,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_uint, f: usize) -> c_int {
    if f == 0 || f > kernels().len() {
        return code::INVALID_HANDLE;
    }
    // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK is 0; the rest (registers, local memory…) the
    // emulation has no figure for.
    *pi = if attrib == 0 { 1024 } else { 0 };
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(f: usize, _attrib: c_uint, _value: c_int) -> c_int {
    if f == 0 || f > kernels().len() {
        return code::INVALID_HANDLE;
    }
    code::SUCCESS
}

/// Bytes of a parameter of type `letter`.
fn param_size(letter: u8) -> usize {
    match letter {
        b'p' | b'U' => 8,
        _ => 4,
    }
}

/// A launch: each parameter's bytes are copied now (as the driver does), every pointer
/// parameter that is not null must be in a live allocation of the stream's GPU when the kernel
/// runs, and the emulator runs it.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: usize,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    smem: c_uint,
    stream: usize,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> c_int {
    if f == 0 || f > kernels().len() {
        return code::INVALID_HANDLE;
    }
    if !extra.is_null() {
        complain("cuLaunchKernel", "`extra` parameters are not supported");
        return code::NOT_SUPPORTED;
    }
    let (name, sig) = &kernels()[f - 1];
    let letters = sig.as_bytes();
    if !letters.is_empty() && params.is_null() {
        complain("cuLaunchKernel", &format!("{name:?}: no parameters given"));
        return code::INVALID_VALUE;
    }
    let values: Vec<u64> = letters
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let p = *params.add(i);
            let mut v = 0u64;
            std::ptr::copy_nonoverlapping(
                p as *const u8,
                &mut v as *mut u64 as *mut u8,
                param_size(l),
            );
            v
        })
        .collect();
    let Some(device) = crate::device_of(stream) else {
        return code::INVALID_HANDLE;
    };
    // A launch on a stream of another GPU than the current context's fails.
    if current() != Some(device) {
        complain(
            "cuLaunchKernel",
            &format!(
                "{name:?} on a stream of GPU {device} from the context of {:?}",
                current()
            ),
        );
        return code::INVALID_HANDLE;
    }
    // A shape the GPU refuses fails the call (the context stays usable).
    if !recipe_kernel_emu::shape_ok([gx, gy, gz], [bx, by, bz], smem) {
        complain(
            "cuLaunchKernel",
            &format!("{name:?}: grid ({gx}, {gy}, {gz}) block ({bx}, {by}, {bz}) smem {smem}"),
        );
        return code::INVALID_VALUE;
    }
    let (name, sig) = (name.clone(), sig.clone());
    let what = format!("kernel {}", name.to_string_lossy());
    let op: Op = Arc::new(move || {
        {
            let st = state();
            for (i, (&l, &v)) in sig.as_bytes().iter().zip(&values).enumerate() {
                if l == b'p' && v != 0 {
                    st.check_range(device, v, 1)
                        .map_err(|e| format!("{}: parameter {i}: {e}", name.to_string_lossy()))?;
                }
            }
        }
        state().stats.kernels += 1;
        let mut slots = values.clone();
        let mut ptrs: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: every pointer parameter was checked to be in a live allocation (host memory
        // here); the slots outlive the call; the signature is the kernel's own.
        let rc = unsafe {
            recipe_kernel_emu::launch_params(
                &name,
                [gx, gy, gz],
                [bx, by, bz],
                smem,
                ptrs.as_mut_ptr(),
                &sig,
            )
        };
        match rc {
            0 => Ok(()),
            -2 => Err(format!(
                "{}: launch shape grid ({gx}, {gy}, {gz}) block ({bx}, {by}, {bz}) with {smem} bytes of shared memory is refused by a GPU",
                name.to_string_lossy()
            )),
            rc => Err(format!("{}: the emulator refused it ({rc})", name.to_string_lossy())),
        }
    });
    enqueue(stream, &what, op)
}

/// `CUlaunchAttribute` (cuda.h): an id, padding and a 64-byte value union.
#[repr(C)]
pub struct LaunchAttribute {
    id: c_uint,
    pad: [u8; 4],
    value: [u8; 64],
}

/// `CUlaunchConfig` (cuda.h).
#[repr(C)]
pub struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    smem: c_uint,
    stream: usize,
    attrs: *const LaunchAttribute,
    count: c_uint,
}

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`.
const PROGRAMMATIC_STREAM_SERIALIZATION: c_uint = 6;

/// `cuLaunchKernel` with attributes. Of those it takes only the programmatic stream
/// serialization (a programmatic dependent launch), counted in the stats: the fake runs a
/// stream's work in order, so the kernel starts after the one ahead of it either way.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: usize,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> c_int {
    let Some(c) = config.as_ref() else {
        return code::INVALID_VALUE;
    };
    if c.count > 0 && c.attrs.is_null() {
        complain("cuLaunchKernelEx", "attributes counted but not given");
        return code::INVALID_VALUE;
    }
    let mut dependent = false;
    for i in 0..c.count as usize {
        let a = &*c.attrs.add(i);
        if a.id != PROGRAMMATIC_STREAM_SERIALIZATION {
            complain(
                "cuLaunchKernelEx",
                &format!("attribute {} is not supported", a.id),
            );
            return code::NOT_SUPPORTED;
        }
        dependent |= i32::from_ne_bytes([a.value[0], a.value[1], a.value[2], a.value[3]]) != 0;
    }
    let rc = cuLaunchKernel(
        f, c.grid[0], c.grid[1], c.grid[2], c.block[0], c.block[1], c.block[2], c.smem, c.stream,
        params, extra,
    );
    if rc == code::SUCCESS && dependent {
        state().stats.dependent_launches += 1;
    }
    rc
}

/// A host function in stream order: runs at its place (now, or at each graph launch).
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    stream: usize,
    func: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
) -> c_int {
    let Some(func) = func else {
        return code::INVALID_VALUE;
    };
    let data = data as usize;
    let op: Op = Arc::new(move || {
        // SAFETY: the caller's function and data, called as the driver would.
        unsafe { func(data as *mut c_void) };
        Ok(())
    });
    enqueue(stream, "cuLaunchHostFunc", op)
}

// ---- errors ----

fn error_text(e: c_int) -> &'static CStr {
    match e {
        0 => c"no error",
        1 => c"invalid argument",
        2 => c"out of memory",
        3 => c"initialization error",
        101 => c"invalid device ordinal",
        200 => c"device kernel image is invalid",
        201 => c"invalid device context",
        400 => c"invalid resource handle",
        500 => c"named symbol not found",
        600 => c"device not ready",
        700 => c"an illegal memory access was encountered",
        719 => c"unspecified launch failure",
        801 => c"operation not supported",
        900 => c"operation not permitted when stream is capturing",
        901 => c"operation failed due to a previous error during capture",
        903 => c"the capture was not initiated in this stream",
        904 => c"capture was not joined",
        905 => c"dependency created on uncaptured work in another stream",
        906 => c"operation would make the legacy stream depend on a capturing blocking stream",
        907 => c"operation not permitted on an event last recorded in a capturing stream",
        _ => c"unknown error (fake CUDA)",
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(e: c_int, out: *mut *const c_char) -> c_int {
    *out = error_text(e).as_ptr();
    code::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(e: c_int, out: *mut *const c_char) -> c_int {
    *out = error_text(e).as_ptr();
    code::SUCCESS
}

#[cfg(test)]
mod tests {
    //! The refusals, each on a case a real GPU would get wrong silently, and a graph's replay.
    use super::*;

    /// Device memory, its context bound on this thread (each test runs on its own thread).
    fn dev_alloc(n_floats: usize) -> u64 {
        set_current(Some(0));
        let mut p = 0u64;
        // SAFETY: an out-pointer to a live u64.
        assert_eq!(
            unsafe { cuMemAlloc_v2(&mut p, n_floats * 4) },
            code::SUCCESS
        );
        p
    }

    fn upload(p: u64, xs: &[f32]) {
        // SAFETY: `p` has room for `xs` (the callers allocate it so).
        let r = unsafe { cuMemcpyHtoD_v2(p, xs.as_ptr() as *const c_void, xs.len() * 4) };
        assert_eq!(r, code::SUCCESS);
    }

    fn download(p: u64, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n];
        // SAFETY: `out` has `n` floats; `p` is a live allocation of at least that.
        let r = unsafe { cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, p, n * 4) };
        assert_eq!(r, code::SUCCESS);
        out
    }

    fn function(name: &CStr) -> usize {
        let mut f = 0;
        // SAFETY: out-pointer and a NUL-terminated name.
        assert_eq!(
            unsafe { cuModuleGetFunction(&mut f, 1, name.as_ptr()) },
            code::SUCCESS
        );
        f
    }

    /// `add_assign(acc, x, n, store)` on `stream`: acc += x.
    fn add_assign(stream: usize, acc: u64, x: u64, n: i32) -> c_int {
        let f = function(c"add_assign");
        let (mut a, mut b, mut n, mut store) = (acc, x, n, 0i32);
        let mut params = [
            &mut a as *mut u64 as *mut c_void,
            &mut b as *mut u64 as *mut c_void,
            &mut n as *mut i32 as *mut c_void,
            &mut store as *mut i32 as *mut c_void,
        ];
        // SAFETY: the kernel's four parameters, each pointing at a live value.
        unsafe {
            cuLaunchKernel(
                f,
                1,
                1,
                1,
                64,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
    }

    fn new_stream() -> usize {
        let mut s = 0;
        // SAFETY: out-pointer.
        assert_eq!(unsafe { cuStreamCreate(&mut s, 1) }, code::SUCCESS);
        s
    }

    fn new_event() -> usize {
        let mut e = 0;
        // SAFETY: out-pointer.
        assert_eq!(unsafe { cuEventCreate(&mut e, 0) }, code::SUCCESS);
        e
    }

    #[test]
    fn a_kernel_runs_on_device_memory_and_fresh_memory_is_nan() {
        let (acc, x) = (dev_alloc(5), dev_alloc(5));
        assert!(
            download(acc, 5).iter().all(|v| v.is_nan()),
            "fresh memory reads as NaN"
        );
        upload(acc, &[1.0, 2.0, 3.0, 4.0, 5.0]);
        upload(x, &[0.5; 5]);
        assert_eq!(add_assign(0, acc, x, 5), code::SUCCESS);
        assert_eq!(download(acc, 5), [1.5, 2.5, 3.5, 4.5, 5.5]);
    }

    #[test]
    fn a_kernel_given_freed_memory_is_refused_and_the_context_fails() {
        // A fault is sticky for its device: GPU 3, which no other test uses.
        set_current(Some(3));
        let mut p = [0u64; 2];
        // SAFETY: out-pointers; live allocations, each freed once.
        unsafe {
            assert_eq!(cuMemAlloc_v2(&mut p[0], 16), code::SUCCESS);
            assert_eq!(cuMemAlloc_v2(&mut p[1], 16), code::SUCCESS);
            assert_eq!(cuMemFree_v2(p[1]), code::SUCCESS);
            assert_eq!(cuMemFree_v2(p[1]), code::INVALID_VALUE, "a double free");
        }
        assert_eq!(add_assign(0, p[0], p[1], 4), code::ILLEGAL_ADDRESS);
        // SAFETY: no arguments.
        assert_eq!(
            unsafe { cuCtxSynchronize() },
            code::ILLEGAL_ADDRESS,
            "sticky"
        );
        let mut q = 0u64;
        // SAFETY: an out-pointer.
        let r = unsafe { cuMemAlloc_v2(&mut q, 16) };
        assert_eq!(r, code::ILLEGAL_ADDRESS, "a dead context allocates nothing");
    }

    #[test]
    fn a_launch_from_another_gpus_context_or_of_a_refused_shape_fails_at_once() {
        let (acc, x) = (dev_alloc(4), dev_alloc(4));
        let s = new_stream();
        set_current(Some(1));
        assert_eq!(
            add_assign(s, acc, x, 4),
            code::INVALID_HANDLE,
            "GPU 0's stream"
        );
        set_current(Some(0));
        let f = function(c"add_assign");
        let (mut a, mut b, mut n, mut store) = (acc, x, 4i32, 0i32);
        let mut params = [
            &mut a as *mut u64 as *mut c_void,
            &mut b as *mut u64 as *mut c_void,
            &mut n as *mut i32 as *mut c_void,
            &mut store as *mut i32 as *mut c_void,
        ];
        // SAFETY: the kernel's parameters; 2048 threads per block is refused before it runs.
        let r = unsafe {
            cuLaunchKernel(
                f,
                1,
                1,
                1,
                2048,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, code::INVALID_VALUE);
        upload(x, &[1.0; 4]);
        upload(acc, &[0.0; 4]);
        assert_eq!(
            add_assign(s, acc, x, 4),
            code::SUCCESS,
            "the context lives on"
        );
    }

    #[test]
    fn a_capture_records_and_each_launch_replays() {
        let (acc, x) = (dev_alloc(3), dev_alloc(3));
        upload(acc, &[0.0; 3]);
        upload(x, &[1.0, 2.0, 3.0]);
        let s = new_stream();
        // SAFETY: a stream of this context; out-pointers.
        unsafe {
            assert_eq!(cuStreamBeginCapture_v2(s, 1), code::SUCCESS);
            assert_eq!(add_assign(s, acc, x, 3), code::SUCCESS);
            let (mut g, mut exec) = (0, 0);
            assert_eq!(cuStreamEndCapture(s, &mut g), code::SUCCESS);
            assert_eq!(cuGraphInstantiateWithFlags(&mut exec, g, 0), code::SUCCESS);
            assert_eq!(download(acc, 3), [0.0; 3], "recorded, not run");
            for _ in 0..3 {
                assert_eq!(cuGraphLaunch(exec, s), code::SUCCESS);
            }
            assert_eq!(cuStreamSynchronize(s), code::SUCCESS);
        }
        assert_eq!(download(acc, 3), [3.0, 6.0, 9.0]);
    }

    #[test]
    fn allocating_or_waiting_inside_a_capture_invalidates_it() {
        set_current(Some(0));
        let s = new_stream();
        // SAFETY: a stream of this context; out-pointers.
        unsafe {
            let mut p = 0;
            let mut g = 0;
            assert_eq!(cuStreamBeginCapture_v2(s, 1), code::SUCCESS);
            assert_eq!(
                cuMemAllocAsync(&mut p, 64, s),
                code::STREAM_CAPTURE_UNSUPPORTED
            );
            assert_eq!(
                cuStreamEndCapture(s, &mut g),
                code::STREAM_CAPTURE_INVALIDATED
            );
            assert_eq!(cuStreamBeginCapture_v2(s, 1), code::SUCCESS);
            assert_eq!(cuStreamSynchronize(s), code::STREAM_CAPTURE_UNSUPPORTED);
            assert_eq!(
                cuStreamEndCapture(s, &mut g),
                code::STREAM_CAPTURE_INVALIDATED
            );
            assert_eq!(cuStreamBeginCapture_v2(s, 1), code::SUCCESS);
            assert_eq!(cuMemAlloc_v2(&mut p, 64), code::STREAM_CAPTURE_UNSUPPORTED);
            assert_eq!(
                cuStreamEndCapture(s, &mut g),
                code::STREAM_CAPTURE_INVALIDATED
            );
            // Relaxed mode (2) lets the capturing thread allocate.
            assert_eq!(cuStreamBeginCapture_v2(s, 2), code::SUCCESS);
            assert_eq!(cuMemAlloc_v2(&mut p, 64), code::SUCCESS);
            assert_eq!(cuStreamEndCapture(s, &mut g), code::SUCCESS);
        }
    }

    #[test]
    fn a_forked_stream_must_be_joined_back_before_the_capture_ends() {
        let (acc, x) = (dev_alloc(2), dev_alloc(2));
        upload(acc, &[0.0; 2]);
        upload(x, &[1.0; 2]);
        let (s, side) = (new_stream(), new_stream());
        let (fork, join) = (new_event(), new_event());
        // SAFETY: streams and events of this context; out-pointers.
        unsafe {
            let mut g = 0;
            for joined in [false, true] {
                assert_eq!(cuStreamBeginCapture_v2(s, 1), code::SUCCESS);
                assert_eq!(cuEventRecord(fork, s), code::SUCCESS);
                assert_eq!(cuStreamWaitEvent(side, fork, 0), code::SUCCESS);
                assert_eq!(add_assign(side, acc, x, 2), code::SUCCESS);
                assert_eq!(cuEventRecord(join, side), code::SUCCESS);
                assert_eq!(cuEventSynchronize(join), code::CAPTURED_EVENT);
                if joined {
                    assert_eq!(cuStreamWaitEvent(s, join, 0), code::SUCCESS);
                    assert_eq!(cuStreamEndCapture(s, &mut g), code::SUCCESS);
                } else {
                    assert_eq!(cuStreamEndCapture(s, &mut g), code::STREAM_CAPTURE_UNJOINED);
                }
            }
        }
        assert_eq!(download(acc, 2), [0.0; 2], "captured only");
    }
}
