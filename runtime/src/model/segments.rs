//! How the forward and backward reach parameters and gradients: one *segment* at a time.
//!
//! The flat parameter buffer is cut into contiguous segments in forward order (the embeddings,
//! each encoder layer, the pooler with the head: [`super::Classifier::segments`]). The forward
//! fetches a segment's parameters just before it uses them and releases them after; the backward
//! does the same in reverse order and hands each segment's finished gradient to a [`GradSink`].
//! A single process backs both with the whole buffers ([`Whole`], [`WholeGrads`]); ZeRO-2
//! reduces each finished gradient segment to the ranks that own it, and ZeRO-3 gathers each
//! segment's parameters from the ranks' partitions and frees them again (`crate::zero`), which is
//! DeepSpeed's bucketed reduction and per-module gather at the granularity of a layer.

use std::convert::Infallible;
use std::ops::Range;

use crate::backend::{Backend, Cpu};

/// Where the forward and backward read each segment's parameters.
pub trait ParamSource<B: Backend> {
    /// Why a fetch failed (e.g. a collective between ranks).
    type Error;
    /// The parameters of segment `seg` (its range of the flat buffer, rebased to 0), valid until
    /// [`ParamSource::release`].
    fn fetch<'s>(&'s mut self, seg: usize) -> Result<B::View<'s>, Self::Error>
    where
        B: 's;
    /// The pass is done with segment `seg` for now.
    fn release(&mut self, seg: usize) -> Result<(), Self::Error>;
}

/// Where the backward accumulates each segment's gradient.
pub trait GradSink<B: Backend> {
    /// Why a segment could not be taken or handed on.
    type Error;
    /// The buffer the backward accumulates segment `seg`'s gradient into (`+=`).
    fn fetch<'s>(&'s mut self, seg: usize) -> Result<B::ViewMut<'s>, Self::Error>
    where
        B: 's;
    /// Segment `seg`'s gradient of this micro-batch is complete.
    fn done(&mut self, seg: usize) -> Result<(), Self::Error>;
    /// Asked before the backward takes segment `seg`, whose weight gradients it leaves
    /// unrounded ([`Backend::gemm_to_epilogue`]): whether the sink rounds them itself in
    /// [`GradSink::done`], fused with a pass of its own over the segment, so that the backward
    /// does not round them first ([`Backend::round_stored`]). By default it does not.
    fn rounds(&mut self, _seg: usize) -> bool {
        false
    }
}

/// Every segment read from one whole flat buffer.
#[derive(Debug)]
pub struct Whole<'a> {
    data: &'a [f32],
    segs: &'a [Range<usize>],
}

impl<'a> Whole<'a> {
    /// The segments `segs` of `data`.
    pub fn new(data: &'a [f32], segs: &'a [Range<usize>]) -> Self {
        Whole { data, segs }
    }
}

impl ParamSource<Cpu> for Whole<'_> {
    type Error = Infallible;
    fn fetch<'s>(&'s mut self, seg: usize) -> Result<&'s [f32], Infallible>
    where
        Cpu: 's,
    {
        Ok(&self.data[self.segs[seg].clone()])
    }
    fn release(&mut self, _: usize) -> Result<(), Infallible> {
        Ok(())
    }
}

/// Every segment's gradient accumulated into one whole flat buffer.
#[derive(Debug)]
pub struct WholeGrads<'a> {
    data: &'a mut [f32],
    segs: &'a [Range<usize>],
}

impl<'a> WholeGrads<'a> {
    /// The segments `segs` of `data`.
    pub fn new(data: &'a mut [f32], segs: &'a [Range<usize>]) -> Self {
        WholeGrads { data, segs }
    }
}

impl GradSink<Cpu> for WholeGrads<'_> {
    type Error = Infallible;
    fn fetch<'s>(&'s mut self, seg: usize) -> Result<&'s mut [f32], Infallible>
    where
        Cpu: 's,
    {
        Ok(&mut self.data[self.segs[seg].clone()])
    }
    fn done(&mut self, _: usize) -> Result<(), Infallible> {
        Ok(())
    }
}

/// Every segment read from one whole parameter buffer of any backend (a GPU's).
pub struct BufParams<'a, B: Backend> {
    be: &'a B,
    data: &'a B::Buf,
    segs: &'a [Range<usize>],
    /// The segments whose fetch still waits for their update ([`Backend::wait_update`]):
    /// each one's first of the pass.
    waits: Vec<bool>,
}

impl<'a, B: Backend> BufParams<'a, B> {
    /// The segments `segs` of `data`, a buffer of `be`.
    pub fn new(be: &'a B, data: &'a B::Buf, segs: &'a [Range<usize>]) -> Self {
        BufParams {
            be,
            data,
            segs,
            waits: Vec::new(),
        }
    }

    /// [`BufParams::new`] whose every fetch of a segment first waits for the segment's last
    /// update queued beside the rest ([`Backend::wait_update`]: the step before this pass).
    pub fn updated(be: &'a B, data: &'a B::Buf, segs: &'a [Range<usize>]) -> Self {
        BufParams {
            waits: vec![true; segs.len()],
            ..Self::new(be, data, segs)
        }
    }
}

impl<B: Backend> ParamSource<B> for BufParams<'_, B> {
    type Error = Infallible;
    fn fetch<'s>(&'s mut self, seg: usize) -> Result<B::View<'s>, Infallible>
    where
        B: 's,
    {
        if let Some(w) = self.waits.get_mut(seg).filter(|w| **w) {
            *w = false;
            self.be.wait_update(seg);
        }
        let whole = self.be.view(self.data);
        Ok(self.be.sub(whole, self.segs[seg].clone()))
    }
    fn release(&mut self, _: usize) -> Result<(), Infallible> {
        Ok(())
    }
}

/// Every segment's gradient accumulated into one whole buffer of any backend.
pub struct BufGrads<'a, B: Backend> {
    be: &'a B,
    data: &'a mut B::Buf,
    segs: &'a [Range<usize>],
    /// A segment whose first fetch waits for an update event first ([`BufGrads::after_update`]).
    wait: Option<(usize, usize)>,
}

impl<'a, B: Backend> BufGrads<'a, B> {
    /// The segments `segs` of `data`, a buffer of `be`.
    pub fn new(be: &'a B, data: &'a mut B::Buf, segs: &'a [Range<usize>]) -> Self {
        BufGrads {
            be,
            data,
            segs,
            wait: None,
        }
    }

    /// With `event`, the first fetch of segment `seg`'s gradient waits first for that update
    /// ([`Backend::wait_update`]): a step beside the pass that zeroes it.
    pub fn after_update(self, seg: usize, event: Option<usize>) -> Self {
        BufGrads {
            wait: event.map(|e| (seg, e)),
            ..self
        }
    }
}

impl<B: Backend> GradSink<B> for BufGrads<'_, B> {
    type Error = Infallible;
    fn fetch<'s>(&'s mut self, seg: usize) -> Result<B::ViewMut<'s>, Infallible>
    where
        B: 's,
    {
        if let Some((_, e)) = self.wait.take_if(|(s, _)| *s == seg) {
            self.be.wait_update(e);
        }
        Ok(self.be.range_mut(self.data, self.segs[seg].clone()))
    }
    fn done(&mut self, _: usize) -> Result<(), Infallible> {
        Ok(())
    }
}
