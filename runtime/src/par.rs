//! Element-wise passes over large host buffers split over scoped threads: the host optimizer's
//! step under optimizer offload (DeepSpeed's `DeepSpeedCPUAdam` runs OpenMP threads for the
//! same reason: one core's memory bandwidth makes a 20M-parameter AdamW step take ~30 ms).
//! Each element's arithmetic is unchanged, so the results are the same bits on any number of
//! threads.

/// Elements per thread below which a pass stays on one thread (starting a thread costs tens of
/// microseconds; 64 Ki elements take about as long on one core).
pub const MIN_PER_THREAD: usize = 1 << 16;

/// How a step over a buffer is cut: into `parts` consecutive ranges, one after another, each
/// on up to `threads` threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// Threads per range.
    pub threads: usize,
    /// Ranges.
    pub parts: usize,
}

/// How many threads a pass over `n` elements uses, at most `threads`.
pub fn split(n: usize, threads: usize) -> usize {
    threads.clamp(1, (n / MIN_PER_THREAD).max(1))
}

/// Runs `f(start, chunk)` over consecutive chunks of `xs`, `start` the chunk's first index, on up
/// to `threads` scoped threads (on this one when a chunk would be small).
pub fn chunks<T: Send>(xs: &mut [T], threads: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let t = split(xs.len(), threads);
    if t == 1 {
        return f(0, xs);
    }
    let per = xs.len().div_ceil(t);
    std::thread::scope(|s| {
        for (i, c) in xs.chunks_mut(per).enumerate() {
            let f = &f;
            s.spawn(move || f(i * per, c));
        }
    });
}

/// [`chunks`] over two buffers of one length, split at the same indices.
pub fn chunks2<T: Send>(
    (a, b): (&mut [T], &mut [T]),
    threads: usize,
    f: impl Fn(usize, &mut [T], &mut [T]) + Sync,
) {
    assert!(a.len() == b.len(), "par::chunks2 lengths");
    let t = split(a.len(), threads);
    if t == 1 {
        return f(0, a, b);
    }
    let per = a.len().div_ceil(t);
    std::thread::scope(|s| {
        for (i, (x, y)) in a.chunks_mut(per).zip(b.chunks_mut(per)).enumerate() {
            let f = &f;
            s.spawn(move || f(i * per, x, y));
        }
    });
}

/// The part of each `(range, flag)` of `segments` inside `start .. start + len`, as a range
/// relative to `start`: the tensors an optimizer's chunk covers.
pub fn within<'s>(
    segments: &'s [(std::ops::Range<usize>, bool)],
    start: usize,
    len: usize,
) -> impl Iterator<Item = (std::ops::Range<usize>, bool)> + 's {
    let end = start + len;
    segments.iter().filter_map(move |(r, flag)| {
        let (lo, hi) = (r.start.max(start), r.end.min(end));
        (lo < hi).then(|| (lo - start..hi - start, *flag))
    })
}

/// [`chunks`] over three buffers of one length, split at the same indices.
pub fn chunks3<T: Send>(
    (a, b, c): (&mut [T], &mut [T], &mut [T]),
    threads: usize,
    f: impl Fn(usize, &mut [T], &mut [T], &mut [T]) + Sync,
) {
    assert!(
        a.len() == b.len() && b.len() == c.len(),
        "par::chunks3 lengths"
    );
    let t = split(a.len(), threads);
    if t == 1 {
        return f(0, a, b, c);
    }
    let per = a.len().div_ceil(t);
    std::thread::scope(|s| {
        let parts = a
            .chunks_mut(per)
            .zip(b.chunks_mut(per))
            .zip(c.chunks_mut(per));
        for (i, ((x, y), z)) in parts.enumerate() {
            let f = &f;
            s.spawn(move || f(i * per, x, y, z));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_is_visited_once_with_its_index() {
        for n in [0, 1, MIN_PER_THREAD - 1, 3 * MIN_PER_THREAD + 5] {
            for threads in [1, 2, 3, 8] {
                let mut xs = vec![0u32; n];
                chunks(&mut xs, threads, |start, c| {
                    for (i, x) in c.iter_mut().enumerate() {
                        *x += (start + i) as u32 + 1;
                    }
                });
                assert!(xs.iter().enumerate().all(|(i, &x)| x == i as u32 + 1));
                let (mut a, mut b, mut c) = (vec![0u32; n], vec![0u32; n], vec![0u32; n]);
                chunks3((&mut a, &mut b, &mut c), threads, |start, x, y, z| {
                    for i in 0..x.len() {
                        (x[i], y[i], z[i]) = ((start + i) as u32, 1, 2);
                    }
                });
                assert!(a.iter().enumerate().all(|(i, &x)| x == i as u32));
                assert!(b.iter().all(|&y| y == 1) && c.iter().all(|&z| z == 2));
            }
        }
    }

    #[test]
    fn small_passes_stay_on_one_thread() {
        assert_eq!(split(MIN_PER_THREAD - 1, 16), 1);
        assert_eq!(split(4 * MIN_PER_THREAD, 16), 4);
        assert_eq!(split(100 * MIN_PER_THREAD, 16), 16);
        assert_eq!(split(100 * MIN_PER_THREAD, 0), 1);
    }
}
