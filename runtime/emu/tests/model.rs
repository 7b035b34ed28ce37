//! The whole BERT classifier's forward and backward through the CUDA backend's launch code on the
//! emulated device, against the CPU backend: every kernel in the order and shapes the model uses
//! them, dropout masks included.

use crate::common;

use common::{calls, close};
use recipe_kernel_emu::Emu;
use recipe_runtime::backend::kernels::Kernels;
use recipe_runtime::backend::{Backend, Cpu};
use recipe_runtime::model::{Batch, BertConfig, Classifier, DropoutKey, Workspace};
use recipe_runtime::precision::Dtype;
use recipe_runtime::rng::Rng;

fn tiny(dropout: f64) -> BertConfig {
    BertConfig::from_json(&format!(
        r#"{{"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 24, "max_position_embeddings": 12,
            "type_vocab_size": 2, "hidden_dropout_prob": {dropout},
            "attention_probs_dropout_prob": {dropout}, "initializer_range": 0.3,
            "pad_token_id": 0}}"#
    ))
    .unwrap()
}

/// Two sequences of 7 tokens (not a multiple of anything), the second padded after 4.
fn batch() -> Batch {
    batch_with(2, 7, 11, |i| if i == 0 { 7 } else { 4 }, |i| i as u32 * 2)
}

/// `bsz` sequences of `seq` tokens (random ids, the second half of each row's real tokens of
/// type 1), row i holding `len(i)` real tokens and label `label(i)`.
fn batch_with(
    bsz: usize,
    seq: usize,
    seed: u64,
    len: impl Fn(usize) -> usize,
    label: impl Fn(usize) -> u32,
) -> Batch {
    let mut r = Rng::new(seed, 1);
    let mut b = Batch {
        batch: bsz,
        seq,
        ..Batch::default()
    };
    for i in 0..bsz {
        let len = len(i);
        for t in 0..seq {
            let real = t < len;
            b.input_ids
                .push(if real { 1 + r.below(39) as u32 } else { 0 });
            b.token_type_ids.push(u32::from(real && t >= len / 2));
            b.attention_mask.push(u32::from(real));
        }
        b.labels.push(label(i));
    }
    b
}

/// (loss, gradient) of one micro-batch on the CPU and on the emulated GPU.
fn both(store: Dtype, dropout: Option<DropoutKey>) -> ((f32, Vec<f32>), (f32, Vec<f32>)) {
    both_on(store, dropout, &batch())
}

/// [`both`] on batch `b`.
fn both_on(
    store: Dtype,
    dropout: Option<DropoutKey>,
    b: &Batch,
) -> ((f32, Vec<f32>), (f32, Vec<f32>)) {
    let p = if dropout.is_some() { 0.2 } else { 0.0 };
    let mut m = Classifier::random(tiny(p), 3, 7).unwrap();
    store.round_slice(m.params_mut());
    m.set_backend(Cpu::new(1).with_store(store));
    let n = m.num_params();
    let mut g_cpu = vec![0.0; n];
    let l_cpu = m
        .forward_backward(&mut Workspace::new(), b, 0.5, &mut g_cpu, dropout)
        .unwrap();

    let k = Kernels::new(Emu).with_store(store);
    let params = k.upload(&m.params().data);
    let mut grads = k.alloc(n);
    let mut ws = Workspace::new();
    let l_gpu = m
        .forward_backward_on(&k, &mut ws, b, 0.5, &params, &mut grads, dropout)
        .unwrap();
    let mut g_gpu = vec![0.0; n];
    k.download(k.view(&grads), &mut g_gpu);
    ((l_cpu, g_cpu), (l_gpu, g_gpu))
}

#[test]
fn fp32_micro_batch_matches_the_cpu() {
    let ((lc, gc), (lg, gg)) = both(Dtype::F32, None);
    assert!((lc - lg).abs() <= 1e-5 * lc.abs(), "loss {lg} vs {lc}");
    close("gradient", &gg, &gc, 1e-5, 1e-4);
}

#[test]
fn dropout_masks_are_the_cpus() {
    let key = Some(DropoutKey {
        seed: 42,
        micro_batch: 3,
    });
    let ((lc, gc), (lg, gg)) = both(Dtype::F32, key);
    assert!((lc - lg).abs() <= 1e-5 * lc.abs(), "loss {lg} vs {lc}");
    close("gradient", &gg, &gc, 1e-5, 1e-4);
    // A different mask would move the loss far more than the tolerance.
    let ((lc0, _), _) = both(Dtype::F32, None);
    assert!(
        (lc0 - lc).abs() > 1e-3,
        "dropout changed nothing: {lc0} vs {lc}"
    );
}

#[test]
fn bf16_storage_stays_near_the_cpu() {
    let ((lc, gc), (lg, gg)) = both(Dtype::Bf16, None);
    assert!((lc - lg).abs() <= 2e-2 * lc.abs(), "loss {lg} vs {lc}");
    close("gradient", &gg, &gc, 2e-2, 5e-2);
}

/// Every gradient a half-precision micro-batch leaves is a value of the storage dtype: the
/// weight gradients' GEMMs leave their f32 sums unrounded and each segment's are rounded in one
/// pass at its end (`Backend::round_stored`), before the gradients are read.
#[test]
fn half_precision_gradients_are_rounded_to_the_store() {
    let key = Some(DropoutKey {
        seed: 11,
        micro_batch: 0,
    });
    for store in [Dtype::F16, Dtype::Bf16] {
        let (_, (_, g)) = both(store, key);
        let mut r = g.clone();
        store.round_slice(&mut r);
        let off = g
            .iter()
            .zip(&r)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            off,
            0,
            "{store:?}: {off} of {} gradients unrounded",
            g.len()
        );
    }
}

/// A GPU runs a launch's blocks in any order: a micro-batch's loss and gradient must not depend
/// on it (no float atomics; the column sums' last blocks add in chunk order whichever block is
/// last: common.cuh, `last_of_column`).
#[test]
fn a_micro_batch_gives_the_same_bits_whatever_order_its_blocks_run_in() {
    let key = Some(DropoutKey {
        seed: 7,
        micro_batch: 1,
    });
    // 154 rows: three chunks of the column sums (64 rows each), so three blocks a column.
    let b = batch_of(14, 11, 5);
    for store in [Dtype::F32, Dtype::Bf16] {
        let (_, (l1, g1)) = both_on(store, key, &b);
        let (_, (l2, g2)) = recipe_kernel_emu::reversed_blocks(|| both_on(store, key, &b));
        assert_eq!(l1.to_bits(), l2.to_bits(), "loss {store:?}");
        assert!(same_bits(&g1, &g2), "gradient {store:?}");
    }
}

/// Models whose heads are 64 wide (hidden 128, two heads: BERT-base's head) and 32 wide (hidden
/// 96, three heads: MiniLM's): on a device keeping 16-bit buffers
/// its forwards' attention (training and evaluation) is one kernel and its backward two (kernels/attention.rs,
/// `fused`; mma.sync emulated), which add q's, k's and v's biases as they load them. Its loss,
/// gradient and logits stay within the store's tolerance of the batched products' (the same
/// device told not to fuse) and of the CPU's. Over 11 tokens, and over 150 (more than one chunk
/// of 128 keys: the long kernels, `attention_fused_long` and the backward's `_long` twins).
#[test]
fn heads_of_64_and_32_train_through_the_fused_attention() {
    for (hidden, heads) in [(128, 2), (96, 3)] {
        heads_train_through_the_fused_attention(hidden, heads, 11);
    }
}

#[test]
fn heads_of_64_and_32_train_through_the_long_fused_attention() {
    for (hidden, heads) in [(128, 2), (96, 3)] {
        heads_train_through_the_fused_attention(hidden, heads, 150);
    }
}

fn heads_train_through_the_fused_attention(hidden: usize, heads: usize, seq: usize) {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::device::Device;
    let cfg = || {
        BertConfig::from_json(&format!(
            r#"{{"vocab_size": 40, "hidden_size": {hidden}, "num_hidden_layers": 1,
                "num_attention_heads": {heads}, "intermediate_size": 64,
                "max_position_embeddings": {}, "type_vocab_size": 2,
                "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                "initializer_range": 0.05, "pad_token_id": 0}}"#,
            seq + 1
        ))
        .unwrap()
    };
    let key = Some(DropoutKey {
        seed: 3,
        micro_batch: 2,
    });
    let b = batch_with(2, seq, 4, |i| seq - 4 * i, |i| i as u32);
    // The kernels of one chunk of keys, or their long twins.
    let long = |name: &'static str| {
        if seq > 128 {
            format!("{name}_long")
        } else {
            name.into()
        }
    };
    for store in [Dtype::F16, Dtype::Bf16] {
        let mut m = Classifier::random(cfg(), 3, 7).unwrap();
        store.round_slice(m.params_mut());
        let n = m.num_params();
        let run = |fused: bool| {
            let k = Kernels::new(EmuTyped)
                .with_store(store)
                .with_fused_attention(fused);
            let params = k.upload(&m.params().data);
            let mut grads = k.alloc(n);
            let mut ws = Workspace::new();
            assert!(EmuTyped.start_profile());
            let loss = m
                .forward_backward_on(&k, &mut ws, &b, 0.5, &params, &mut grads, key)
                .unwrap();
            let logits = m.forward_on(&k, &mut ws, &b, &params).unwrap();
            let p = EmuTyped.profile().expect("started");
            let mut g = vec![0.0; n];
            k.download(k.view(&grads), &mut g);
            (
                (loss, g, logits),
                [
                    long("attention_fused"),
                    "attention_softmax".into(),
                    long("attention_bwd_dq"),
                    long("attention_bwd_dkv"),
                    "attention_softmax_bwd".into(),
                    "add_bias".into(),
                ]
                .map(|name| calls(&p, &name)),
            )
        };
        let ((lf, gf, ef), calls) = run(true);
        // The training forward, the backward and the evaluation's forward fused (the last
        // runs the training forward's attention: bert.rs, `self_attention`).
        let fused_calls = calls;
        let ((lu, gu, eu), calls) = run(false);
        assert_eq!(calls[..5], [0, 2, 0, 0, 1], "{store:?} unfused");
        // q's, k's and v's biases added by the fused kernels, not by `add_bias` (one pass a
        // layer), in both forwards.
        assert_eq!(
            fused_calls,
            [2, 0, 1, 1, 0, calls[5] - 2],
            "{store:?} fused"
        );
        let tol = if store == Dtype::Bf16 { 2e-2 } else { 2e-3 };
        assert!(
            (lf - lu).abs() <= tol * lu.abs(),
            "{store:?} loss {lf} vs {lu}"
        );
        close("gradient", &gf, &gu, tol, 5.0 * tol);
        close("logits", &ef, &eu, tol, 5.0 * tol);
        m.set_backend(Cpu::new(1).with_store(store));
        let mut gc = vec![0.0; n];
        let lc = m
            .forward_backward(&mut Workspace::new(), &b, 0.5, &mut gc, key)
            .unwrap();
        assert!(
            (lf - lc).abs() <= tol * lc.abs(),
            "{store:?} loss {lf} vs CPU {lc}"
        );
        close("gradient vs CPU", &gf, &gc, tol, 5.0 * tol);
    }
}

/// Evaluation logits (the evaluation forward: one layer's buffers, the last layer on the `[CLS]`
/// rows only) on the emulated GPU against the CPU's.
fn eval_logits(store: Dtype) -> (Vec<f32>, Vec<f32>) {
    let mut m = Classifier::random(tiny(0.0), 3, 7).unwrap();
    store.round_slice(m.params_mut());
    m.set_backend(Cpu::new(1).with_store(store));
    let b = batch();
    let cpu = m.forward(&b).unwrap();
    let k = Kernels::new(Emu).with_store(store);
    let params = k.upload(&m.params().data);
    let gpu = m
        .forward_on(&k, &mut Workspace::new(), &b, &params)
        .unwrap();
    (cpu, gpu)
}

#[test]
fn eval_logits_match_the_cpu() {
    let (cpu, gpu) = eval_logits(Dtype::F32);
    assert_eq!(cpu.len(), 2 * 3);
    close("logits", &gpu, &cpu, 1e-5, 1e-5);
    let (cpu, gpu) = eval_logits(Dtype::Bf16);
    close("bf16 logits", &gpu, &cpu, 2e-2, 2e-2);
}

/// The evaluation forward on a device that captures (`EmuTyped`) runs a shape directly, then
/// captures it, then replays the graph (model/on_device/graphs.rs): every batch's logits are its
/// own, bit for bit those of the same forwards run directly on `Emu`, the replays included —
/// with other inputs, after another shape reshaped the buffers, and after the parameters
/// changed (uploaded into the buffer the graph reads).
#[test]
fn evaluation_forwards_replay_from_graphs_with_their_own_inputs_and_parameters() {
    use recipe_kernel_emu::{graphs_replayed, EmuTyped};
    use recipe_runtime::model::OnDevice;
    let mut direct = Classifier::random(tiny(0.0), 3, 7).unwrap();
    let mut graphed = Classifier::random(tiny(0.0), 3, 7).unwrap();
    direct.set_executor(OnDevice::new(Kernels::new(Emu), "emulated GPU"));
    graphed.set_executor(OnDevice::new(Kernels::new(EmuTyped), "emulated GPU"));
    // (batch, length, whether the parameters change first, run from a graph: a shape's second
    // forward is captured, and the graph launched, its third and later replay it)
    let evals = [
        (3, 9, false, false),
        (3, 9, false, true),
        (3, 9, false, true),
        (2, 5, false, false),
        (3, 9, false, true),
        (3, 9, true, true),
        (2, 5, false, true),
        (2, 5, true, true),
    ];
    for (i, &(bsz, seq, change, replay)) in evals.iter().enumerate() {
        if change {
            for m in [&mut direct, &mut graphed] {
                m.params_mut()[5] += 0.25;
            }
        }
        let b = batch_of(bsz, seq, 40 + i as u64);
        let before = graphs_replayed();
        let want = direct.forward(&b).unwrap();
        let got = graphed.forward(&b).unwrap();
        assert_eq!(
            graphs_replayed() - before,
            u64::from(replay),
            "evaluation {i} ({bsz}×{seq})"
        );
        assert!(
            same_bits(&got, &want),
            "evaluation {i}: {got:?} vs {want:?}"
        );
        if i > 0 {
            let b0 = batch_of(bsz, seq, 40);
            assert!(
                !same_bits(&got, &direct.forward(&b0).unwrap()),
                "evaluation {i} gave another batch's logits"
            );
        }
    }
}

/// Which runs keep the model states on the device (`Replica::keep_on_device`) and step the
/// optimizer there: one rank at every ZeRO stage, whatever the optimizer (Adam/AdamW, SGD here;
/// Adagrad and LAMB alike); under optimizer offload the model stays on the device and the host
/// steps; several ranks keep the host's path. A device storing another dtype than the run trains
/// in is refused, not trained on.
#[test]
fn one_rank_keeps_the_model_on_the_device_at_every_stage_and_the_optimizer_without_offload() {
    use recipe_runtime::model::OnDevice;
    use recipe_runtime::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
    use recipe_runtime::zero::{Replica, Shard, Storage};

    let replica = |stage: u8, world: usize, offload: bool, sgd: bool, module: Dtype| {
        let mut m = Classifier::random(tiny(0.0), 3, 7).unwrap();
        m.set_executor(OnDevice::new(Kernels::new(Emu), "emulated GPU"));
        let shard = Shard::new(stage, world, 0, m.segments());
        let entries = &m.params().entries;
        let decay = vec![true; entries.len()];
        let opt: Optimizer = if sgd {
            let c = SgdConfig::new(0.9, false, 0.0);
            Sgd::shard(c, entries, &decay, &shard.ranges)
                .unwrap()
                .into()
        } else {
            let c = AdamConfig::adamw(0.01);
            Adam::shard(c, entries, &decay, &shard.ranges)
                .unwrap()
                .into()
        };
        let storage = Storage {
            module,
            comm: module,
        };
        Replica::new(m, stage, world, 0, opt, offload, storage).unwrap()
    };
    // (model on the device, optimizer on the device)
    let keeps = |stage, world, offload, sgd| {
        let mut r = replica(stage, world, offload, sgd, Dtype::F32);
        let kept = r.keep_on_device().unwrap();
        assert_eq!(kept, r.on_device());
        (kept, r.optimizer_on_device())
    };
    for stage in 0..=3 {
        assert_eq!(keeps(stage, 1, false, false), (true, true), "ZeRO-{stage}");
        if stage >= 1 {
            let offloaded = keeps(stage, 1, true, false);
            assert_eq!(
                offloaded,
                (true, false),
                "ZeRO-{stage} with optimizer offload"
            );
        }
    }
    assert_eq!(keeps(1, 2, false, false), (false, false), "two ranks");
    assert_eq!(keeps(0, 1, false, true), (true, true), "SGD");
    assert_eq!(
        keeps(1, 1, true, true),
        (true, false),
        "SGD with optimizer offload"
    );
    let mut r = replica(0, 1, false, false, Dtype::Bf16);
    let e = r.keep_on_device().unwrap_err().to_string();
    assert!(e.contains("stores F32") && e.contains("Bf16"), "{e}");
}

/// An executor that counts what the training loop asks of the device it wraps.
struct Counted {
    inner: std::sync::Arc<recipe_runtime::model::OnDevice<Emu>>,
    /// (micro-batches, gradient downloads, uploads, passes-only passes, sums between devices,
    /// windows landed during their last backward, parameter ranges queued up)
    calls: std::sync::Mutex<[usize; 7]>,
}

impl Counted {
    fn count(&self, i: usize) {
        self.calls.lock().unwrap()[i] += 1;
    }
}

impl recipe_runtime::model::Executor for Counted {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn forward_backward(
        &self,
        model: &Classifier,
        batch: &Batch,
        loss_weight: f32,
        grads: &mut [f32],
        dropout: Option<DropoutKey>,
    ) -> Result<f32, recipe_runtime::model::ModelError> {
        self.count(3);
        self.inner
            .forward_backward(model, batch, loss_weight, grads, dropout)
    }

    fn forward(
        &self,
        model: &Classifier,
        batch: &Batch,
    ) -> Result<Vec<f32>, recipe_runtime::model::ModelError> {
        self.inner.forward(model, batch)
    }

    fn resident(&self) -> Option<&dyn recipe_runtime::optim::device::Resident> {
        Some(self)
    }
}

impl recipe_runtime::optim::device::Resident for Counted {
    fn upload(
        &self,
        model: &Classifier,
        module: Dtype,
        keep: recipe_runtime::optim::device::Keep<'_>,
    ) -> Result<(), recipe_runtime::model::ModelError> {
        self.inner.upload(model, module, keep)
    }

    fn zero_grads(&self) -> Result<(), recipe_runtime::model::ModelError> {
        self.inner.zero_grads()
    }

    fn micro(
        &self,
        model: &Classifier,
        batch: &Batch,
        weight: f32,
        dropout: Option<DropoutKey>,
    ) -> Result<Option<f32>, recipe_runtime::model::ModelError> {
        self.count(0);
        self.inner.micro(model, batch, weight, dropout)
    }

    fn window_losses(&self) -> Result<Vec<f32>, recipe_runtime::model::ModelError> {
        self.inner.window_losses()
    }

    fn grad_sq(&self) -> Result<f64, recipe_runtime::model::ModelError> {
        self.inner.grad_sq()
    }

    fn step(
        &self,
        opt: &recipe_runtime::optim::Optimizer,
        lr: f64,
        factors: (f32, f32),
    ) -> Result<(), recipe_runtime::zero::ZeroError> {
        self.inner.step(opt, lr, factors)
    }

    fn download(
        &self,
        model: &mut Classifier,
        opt: Option<&mut recipe_runtime::optim::Optimizer>,
        master: Option<&mut [f32]>,
    ) -> Result<(), recipe_runtime::zero::ZeroError> {
        self.inner.download(model, opt, master)
    }

    fn pinned(&self, n: usize) -> recipe_runtime::optim::device::PinnedBuf {
        self.inner.pinned(n)
    }

    fn download_grads(&self, dst: &mut [f32]) -> Result<(), recipe_runtime::model::ModelError> {
        self.count(1);
        self.inner.download_grads(dst)
    }

    unsafe fn upload_params_part(&self, at: usize, src: &[f32]) -> bool {
        // SAFETY: the caller's contract, passed on.
        let queued = unsafe { self.inner.upload_params_part(at, src) };
        if queued {
            self.count(6);
        }
        queued
    }

    fn params_uploaded(&self) -> Result<(), recipe_runtime::model::ModelError> {
        self.count(2);
        self.inner.params_uploaded()
    }

    fn land_next(
        &self,
        dst: recipe_runtime::optim::device::Landing,
        storage: recipe_runtime::zero::Storage,
    ) -> bool {
        self.inner.land_next(dst, storage)
    }

    fn sum_next(&self) -> bool {
        self.inner.sum_next()
    }

    fn landed(&self) -> Result<(), recipe_runtime::model::ModelError> {
        self.count(5);
        self.inner.landed()
    }

    fn upload_params(&self, src: &[f32]) -> Result<(), recipe_runtime::model::ModelError> {
        self.count(2);
        self.inner.upload_params(src)
    }

    fn upload_grads(&self, src: &[f32]) -> Result<(), recipe_runtime::model::ModelError> {
        self.count(2);
        self.inner.upload_grads(src)
    }

    fn peers(&self) -> Option<(usize, usize)> {
        self.inner.peers()
    }

    fn average_grads(
        &self,
        storage: recipe_runtime::zero::Storage,
    ) -> Result<(), recipe_runtime::model::ModelError> {
        self.count(4);
        self.inner.average_grads(storage)
    }

    fn reduce_to_owners(
        &self,
        owners: &[(std::ops::Range<usize>, usize)],
        storage: recipe_runtime::zero::Storage,
        dst: &mut [f32],
    ) -> Result<(), recipe_runtime::model::ModelError> {
        self.count(1);
        self.count(4);
        self.inner.reduce_to_owners(owners, storage, dst)
    }
}

/// Optimizer offload with the model on the device (ZeRO-2, one rank): the micro-batches
/// accumulate on the device, and each optimizer step makes exactly one gradient copy down and
/// one parameter copy up, never a passes-only pass (which copies the accumulator both ways per
/// micro-batch); the weights are the host path's. Told which micro-batch is a window's last
/// (`Replica::last_micro`, as `recipe run` does), the device copies the gradient down during
/// that backward instead (`Resident::land_next`, segment by segment; one wait per step), with
/// the same weights bit for bit.
#[test]
fn optimizer_offload_copies_the_gradients_down_and_the_parameters_up_once_per_step() {
    use recipe_runtime::collective::LocalCollective;
    use recipe_runtime::model::OnDevice;
    use recipe_runtime::optim::{Adam, AdamConfig};
    use recipe_runtime::zero::{Replica, Shard, Storage};

    let counted = || {
        std::sync::Arc::new(Counted {
            inner: OnDevice::new(Kernels::new(Emu), "emulated GPU"),
            calls: std::sync::Mutex::new([0; 7]),
        })
    };
    let replica = |device: Option<&std::sync::Arc<Counted>>| {
        let mut m = Classifier::random(tiny(0.0), 3, 7).unwrap();
        if let Some(c) = device {
            m.set_executor(c.clone());
        }
        let shard = Shard::new(2, 1, 0, m.segments());
        let entries = &m.params().entries;
        let decay = vec![true; entries.len()];
        let opt = Adam::shard(AdamConfig::adamw(0.01), entries, &decay, &shard.ranges).unwrap();
        let mut r = Replica::new(m, 2, 1, 0, opt, true, Storage::fp32()).unwrap();
        assert_eq!(r.keep_on_device().unwrap(), device.is_some());
        assert!(!r.optimizer_on_device());
        r
    };
    let train = |r: &mut Replica, land: bool| {
        let mut coll = LocalCollective::group(1, std::time::Duration::from_secs(60))
            .pop()
            .unwrap();
        let mut ws = Workspace::new();
        for _ in 0..3 {
            r.start_window().unwrap();
            for i in 0..2 {
                if land && i == 1 {
                    r.last_micro();
                }
                r.micro(&mut coll, &mut ws, &batch(), 0.5, None).unwrap();
            }
            r.finish_window(&mut coll).unwrap();
            r.clip(&mut coll, 1.0).unwrap();
            r.step(&mut coll, 1e-2, 1.0).unwrap();
        }
        r.gather_whole(&mut coll).unwrap();
        r.model().params().data.clone()
    };
    let (after, during) = (counted(), counted());
    let gpu = train(&mut replica(Some(&after)), false);
    let landed = train(&mut replica(Some(&during)), true);
    let cpu = train(&mut replica(None), false);
    // micro-batches, gradient downloads, parameter uploads, …, landed windows.
    assert_eq!(*after.calls.lock().unwrap(), [6, 3, 3, 0, 0, 0, 3]);
    assert_eq!(*during.calls.lock().unwrap(), [6, 0, 3, 0, 0, 3, 3]);
    close("weights", &gpu, &cpu, 1e-5, 1e-5);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&landed), bits(&gpu), "landed during the backward");
}

/// A device keeps each micro-batch's loss until the window ends (`Replica::micro` gives `None`)
/// and `window_losses` reads them in one copy, in order: the values `forward_backward_on` reads
/// at once, bit for bit, over windows of different lengths and batch shapes (the loss buffer
/// grows in the first window, then is reused).
#[test]
fn a_window_reads_its_micro_batch_losses_back_once_in_order() {
    use recipe_runtime::collective::LocalCollective;
    use recipe_runtime::model::OnDevice;
    use recipe_runtime::optim::{Adam, AdamConfig};
    use recipe_runtime::zero::{Replica, Shard, Storage};

    let m = Classifier::random(tiny(0.0), 3, 7).unwrap();
    let k = Kernels::new(Emu);
    let params = k.upload(&m.params().data);
    let mut model = m.clone();
    model.set_executor(OnDevice::new(Kernels::new(Emu), "emulated GPU"));
    let shard = Shard::new(0, 1, 0, model.segments());
    let entries = &model.params().entries;
    let decay = vec![true; entries.len()];
    let opt = Adam::shard(AdamConfig::adamw(0.01), entries, &decay, &shard.ranges).unwrap();
    let mut r = Replica::new(model, 0, 1, 0, opt, false, Storage::fp32()).unwrap();
    assert!(r.keep_on_device().unwrap());
    let mut coll = LocalCollective::group(1, std::time::Duration::from_secs(60))
        .pop()
        .unwrap();
    let mut ws = Workspace::new();
    let mut at_once = Workspace::<Kernels<Emu>>::new();
    for (window, sizes) in [
        vec![(2, 6), (3, 5)],
        vec![(1, 4), (2, 6), (3, 3)],
        vec![(2, 2)],
    ]
    .into_iter()
    .enumerate()
    {
        r.start_window().unwrap();
        let mut want = Vec::new();
        for (i, &(bsz, seq)) in sizes.iter().enumerate() {
            let b = batch_of(bsz, seq, 100 * window as u64 + i as u64);
            assert_eq!(r.micro(&mut coll, &mut ws, &b, 0.5, None).unwrap(), None);
            let mut g = k.alloc(m.params().len());
            let l = m
                .forward_backward_on(&k, &mut at_once, &b, 0.5, &params, &mut g, None)
                .unwrap();
            want.push(l);
        }
        let got = r.window_losses().unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "window {window}");
        assert!(r.window_losses().unwrap().is_empty(), "read twice");
        r.finish_window(&mut coll).unwrap();
        // No step: every window sees the same parameters as the at-once passes.
    }
}

/// Two ranks, each on its own device (`Replica::attach_device`), at every ZeRO stage: what
/// crosses between device and host per rank over 3 steps of 2 micro-batches, and rank 0's
/// weights against the CPU ranks'.
/// - Exchanging through the host: ZeRO-0 and 1 one gradient copy down and one copy up per step
///   (the averaged gradient, or the parameters), ZeRO-2 and 3 one gradient copy down per
///   micro-batch and the parameters up once per step; never a passes-only pass.
/// - With peers (the devices sum directly, NCCL on GPUs): ZeRO 0–2 nothing at all, the
///   optimizer on the device (ZeRO 1–2 over the rank's partition): ZeRO 0–1 one all-reduce per
///   segment per step (during the window's last backward), ZeRO-2 one reduce per segment's part
///   in an owner's range per micro-batch (as the backward finishes the segment), ZeRO 1–2 one
///   broadcast per owner per step. The
///   weights are the host exchange's bit for bit (the emulated sums are the host's, in rank
///   order, and the device optimizer's arithmetic is the host's).
/// - ZeRO-3 with peers: nothing crosses either; each device holds its pieces, gathers each
///   segment from the owners when a pass reads it (but the backward's first two, which the
///   forward left in the two segment buffers) and reduces its gradient to them as the backward
///   finishes it.
/// - ZeRO 2–3 with peers and optimizer offload: the rank's partition down during the window's
///   last backward (each segment's piece once reduced) and up range by range during the host's
///   step, one wait each per step. ZeRO-1: the whole summed as without offload, the rank's
///   range of each segment's average landed as the sums come in, up range by range.
#[test]
fn two_ranks_on_devices_copy_once_per_step_or_micro_batch_as_their_stage_needs() {
    use recipe_kernel_emu::EmuPeers;
    use recipe_runtime::collective::LocalCollective;
    use recipe_runtime::model::OnDevice;
    use recipe_runtime::optim::{Adam, AdamConfig};
    use recipe_runtime::zero::{Replica, Shard, Storage};

    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Cpu,
        Host,
        Peers,
    }
    type Calls = (Vec<[usize; 7]>, Vec<[usize; 3]>);
    let run = |stage: u8, mode: Mode, offload: bool| -> (Vec<f32>, Calls) {
        let group = LocalCollective::group(2, std::time::Duration::from_secs(60));
        let mut peers: Vec<Option<EmuPeers>> = EmuPeers::group(2).into_iter().map(Some).collect();
        std::thread::scope(|s| {
            let ranks: Vec<_> = group
                .into_iter()
                .zip(peers.iter_mut())
                .enumerate()
                .map(|(rank, (mut coll, p))| {
                    let p = p.take().unwrap();
                    s.spawn(move || {
                        let sums = std::sync::Arc::new(std::sync::Mutex::new([0; 3]));
                        let p = CountedPeers {
                            inner: p,
                            calls: sums.clone(),
                        };
                        let inner = match mode {
                            Mode::Peers => {
                                OnDevice::with_peers(Kernels::new(Emu), "emulated GPU", Box::new(p))
                            }
                            _ => OnDevice::new(Kernels::new(Emu), "emulated GPU"),
                        };
                        let counted = std::sync::Arc::new(Counted {
                            inner,
                            calls: std::sync::Mutex::new([0; 7]),
                        });
                        let mut m = Classifier::random(tiny(0.0), 3, 7).unwrap();
                        if mode != Mode::Cpu {
                            m.set_executor(counted.clone());
                        }
                        let shard = Shard::new(stage, 2, rank, m.segments());
                        let entries = &m.params().entries;
                        let decay = vec![true; entries.len()];
                        let c = AdamConfig::adamw(0.01);
                        let opt = Adam::shard(c, entries, &decay, &shard.ranges).unwrap();
                        let mut r =
                            Replica::new(m, stage, 2, rank, opt, offload, Storage::fp32()).unwrap();
                        assert_eq!(r.attach_device(&mut coll).unwrap(), mode != Mode::Cpu);
                        let mut ws = Workspace::new();
                        for step in 0..3u64 {
                            r.start_window().unwrap();
                            for i in 0..2u64 {
                                let b = batch_of(2, 6, 10 * step + 2 * i + rank as u64);
                                if i == 1 {
                                    r.last_micro();
                                }
                                r.micro(&mut coll, &mut ws, &b, 0.5, None).unwrap();
                            }
                            r.finish_window(&mut coll).unwrap();
                            r.clip(&mut coll, 1.0).unwrap();
                            r.step(&mut coll, 1e-2, 1.0).unwrap();
                        }
                        assert_eq!(
                            r.optimizer_on_device(),
                            !offload && (mode == Mode::Peers || mode == Mode::Host && stage == 0)
                        );
                        r.gather_whole(&mut coll).unwrap();
                        let calls = *counted.calls.lock().unwrap();
                        let sums = *sums.lock().unwrap();
                        (r.model().params().data.clone(), calls, sums)
                    })
                })
                .collect();
            let mut out: Vec<(Vec<f32>, [usize; 7], [usize; 3])> =
                ranks.into_iter().map(|h| h.join().unwrap()).collect();
            let calls = out.iter().map(|o| o.1).collect();
            let sums = out.iter().map(|o| o.2).collect();
            (std::mem::take(&mut out[0].0), (calls, sums))
        })
    };
    for stage in 0..=3u8 {
        let (host, (calls, _)) = run(stage, Mode::Host, false);
        let (cpu, _) = run(stage, Mode::Cpu, false);
        let want = if stage <= 1 {
            [6, 3, 3, 0, 0, 0, 0]
        } else {
            [6, 6, 3, 0, 0, 0, 0]
        };
        assert_eq!(calls, vec![want; 2], "ZeRO-{stage} through the host");
        close(&format!("ZeRO-{stage} weights"), &host, &cpu, 1e-5, 1e-5);
        let (peers, (calls, sums)) = run(stage, Mode::Peers, false);
        let want = match stage {
            0 | 1 => [6, 0, 0, 0, 3, 0, 0],
            _ => [6, 0, 0, 0, 0, 0, 0],
        };
        assert_eq!(calls, vec![want; 2], "ZeRO-{stage} with peers");
        // (all-reduces, reduces, broadcasts) between the devices, per rank.
        let segments = Classifier::random(tiny(0.0), 3, 7)
            .unwrap()
            .segments()
            .to_vec();
        let segs = segments.len();
        // ZeRO-2: each segment's part in each owner's range, summed to it as the backward
        // finishes the segment.
        let owners: Vec<Vec<std::ops::Range<usize>>> = (0..2)
            .map(|r| Shard::new(2, 2, r, &segments).ranges)
            .collect();
        let parts = segments
            .iter()
            .flat_map(|s| {
                owners
                    .iter()
                    .flatten()
                    .filter(|r| r.start < s.end && s.start < r.end)
            })
            .count();
        match stage {
            // The window's sums during its last backward, one per segment.
            0 => assert_eq!(sums, vec![[3 * segs, 0, 0]; 2]),
            1 => assert_eq!(sums, vec![[3 * segs, 0, 6]; 2]),
            2 => assert_eq!(sums, vec![[0, 6 * parts, 6]; 2], "{parts} parts"),
            // Per micro-batch each segment's gradient to its 2 owners, and each segment
            // gathered (2 broadcasts) for the forward, again for the backward but the last two
            // (still held in the two segment buffers), and once more for the final
            // `gather_whole`.
            _ => {
                let (reduces, gathers) = (6 * segs * 2, (6 * (2 * segs - 2) + segs) * 2);
                assert_eq!(
                    sums,
                    vec![[0, reduces, gathers]; 2],
                    "ZeRO-3, {segs} segments"
                );
            }
        }
        assert!(
            same_bits(&peers, &host),
            "ZeRO-{stage}: the peers' weights are not the host exchange's"
        );
        if stage < 1 {
            continue;
        }
        // Optimizer offload (recipes/cls.rcp's shape) at ZeRO 2–3: the partition accumulated on
        // the device, landed on the host during each window's last backward (each segment's
        // piece as it is reduced and added: no download after the window, one wait), the host
        // stepping it and queuing its ranges up as it goes (one range for the tiny model, one
        // wait); the same sums between the devices plus ZeRO-2's broadcasts of the parameters
        // after each step. ZeRO-1: the whole gradient summed on the devices as without
        // offload, each segment made the average and its part in the rank's range landed as
        // the sums come in (no download after the window, one wait; its norm summed on the
        // device over the whole), its range up as the host steps it and the owners'
        // broadcasts.
        let (host, _) = run(stage, Mode::Host, true);
        let (peers, (calls, sums)) = run(stage, Mode::Peers, true);
        let want = [6, 0, 3, 0, 3 * usize::from(stage == 1), 3, 3];
        assert_eq!(calls, vec![want; 2], "ZeRO-{stage} offloaded");
        let want = match stage {
            1 => [3 * segs, 0, 6],
            2 => [0, 6 * parts, 6],
            _ => [0, 6 * 2 * segs, (6 * (2 * segs - 2) + segs) * 2],
        };
        assert_eq!(sums, vec![want; 2], "ZeRO-{stage} offloaded");
        assert!(
            same_bits(&peers, &host),
            "ZeRO-{stage} offloaded: not the host exchange's weights"
        );
    }
}

/// Whether two buffers hold the same bits.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Emulated peers that count their (all-reduces, reduces, broadcasts).
struct CountedPeers {
    inner: recipe_kernel_emu::EmuPeers,
    calls: std::sync::Arc<std::sync::Mutex<[usize; 3]>>,
}

impl recipe_runtime::backend::device::Peers<Emu> for CountedPeers {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world(&self) -> usize {
        self.inner.world()
    }

    fn all_reduce_sum(&mut self, dev: &Emu, buf: &mut [f32]) -> Result<(), String> {
        self.calls.lock().unwrap()[0] += 1;
        self.inner.all_reduce_sum(dev, buf)
    }

    fn reduce_sum(&mut self, dev: &Emu, buf: &mut [f32], root: usize) -> Result<(), String> {
        self.calls.lock().unwrap()[1] += 1;
        self.inner.reduce_sum(dev, buf, root)
    }

    fn broadcast(&mut self, dev: &Emu, buf: &mut [f32], root: usize) -> Result<(), String> {
        self.calls.lock().unwrap()[2] += 1;
        self.inner.broadcast(dev, buf, root)
    }
}

/// A batch of `bsz` sequences padded to `seq`, row i holding `seq - i` real tokens.
fn batch_of(bsz: usize, seq: usize, seed: u64) -> Batch {
    batch_with(
        bsz,
        seq,
        seed,
        |i| seq.saturating_sub(i).max(1),
        |i| (i % 3) as u32,
    )
}

/// No device allocation in the step loop: a run's micro-batches are padded to their longest row,
/// so their lengths vary; the workspace sized by the longest one so far is resized in place for
/// the others (`Acts::reshape`), training and evaluation alike. Each pass through the reused
/// workspace gives the same bits as a fresh one, and a longer batch than any before does
/// allocate (the count is not blind); a workspace reserved for the plan's longest shapes first
/// (`Classifier::reserve_on`, as the run does) allocates in no pass at all. On both emulated
/// devices: the one keeping bf16 values in 16-bit buffers also has the kernels' own 16-bit room
/// for attention's `ds`, which the reservation sizes for the training batch.
#[test]
fn a_reused_workspace_allocates_nothing_for_shorter_batches_and_gives_the_same_bits() {
    reused_workspace(Kernels::new(Emu));
    reused_workspace(Kernels::new(recipe_kernel_emu::EmuTyped).with_store(Dtype::Bf16));
}

fn reused_workspace<D: recipe_runtime::backend::device::Device + Clone>(k: Kernels<D>) {
    let m = Classifier::random(tiny(0.1), 3, 7).unwrap();
    let n = m.num_params();
    let params = k.upload(&m.params().data);
    let mut grads = k.alloc(n);
    let mut ws = Workspace::new();
    // One pass of `k` on `ws` and one on a fresh workspace: loss, gradient and logits agree bit
    // for bit.
    let mut pass = |k: &Kernels<D>, b: &Batch, i: u64, ws: &mut Workspace<Kernels<D>>| {
        let key = Some(DropoutKey {
            seed: 5,
            micro_batch: i,
        });
        k.zero(k.view_mut(&mut grads));
        let loss = m
            .forward_backward_on(k, ws, b, 1.0, &params, &mut grads, key)
            .unwrap();
        let mut g = vec![0.0; n];
        k.download(k.view(&grads), &mut g);
        let logits = m.forward_on(k, ws, b, &params).unwrap();
        (loss, g, logits)
    };
    let shapes = [(3, 11), (3, 6), (2, 11), (1, 3), (3, 9), (2, 11)];
    for (i, &(bsz, seq)) in shapes.iter().enumerate() {
        let b = batch_of(bsz, seq, 20 + i as u64);
        let before = k.allocations();
        let reused = pass(&k, &b, i as u64, &mut ws);
        let allocated = k.allocations() - before;
        if i == 0 {
            assert!(
                allocated > 0,
                "the first batch allocated nothing: the count is blind"
            );
        } else {
            assert_eq!(allocated, 0, "batch {i} ({bsz}×{seq}) allocated");
        }
        let fresh = pass(&k, &b, i as u64, &mut Workspace::new());
        assert_eq!(reused.0.to_bits(), fresh.0.to_bits(), "loss, batch {i}");
        assert!(reused.1 == fresh.1, "gradient, batch {i}");
        assert!(reused.2 == fresh.2, "logits, batch {i}");
    }
    // A longer batch than any before grows the buffers: counted.
    let before = k.allocations();
    pass(&k, &batch_of(3, 12, 9), 9, &mut ws);
    assert!(k.allocations() > before, "a longer batch allocated nothing");
    // Reserved for the longest shapes first (what `recipe run` does before its first step), on
    // kernels whose own scratch is new too: no pass allocates, the longest included; with a
    // larger evaluation batch than any training one (reserved for its forward only).
    let k = Kernels::new(k.device().clone()).with_store(k.store());
    let mut reserved = Workspace::new();
    m.reserve_on(&k, &mut reserved, 3, 4, 12);
    let before = k.allocations();
    for (i, &(bsz, seq)) in shapes.iter().chain(&[(3, 12)]).enumerate() {
        pass(
            &k,
            &batch_of(bsz, seq, 30 + i as u64),
            i as u64,
            &mut reserved,
        );
    }
    assert_eq!(
        k.allocations(),
        before,
        "a pass on a reserved workspace allocated"
    );
}

/// The evaluation's f32 room for the scores (`Backend::attention_needs_scores`): on a device
/// keeping 16-bit buffers, heads of 64 take the fused kernels at every length (one chunk of 128
/// keys, or the long kernel past it), which need none. A workspace reserved for 130 keys
/// evaluates 130, 100 and again 130 keys without allocating, through the long kernel, the short
/// one and the long one; the same model told not to fuse reserves more, the scores' room the
/// batched products write.
#[test]
fn the_fused_kernels_need_no_room_for_the_scores_at_any_length() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::device::Device;
    let cfg = BertConfig::from_json(
        r#"{"vocab_size": 40, "hidden_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 32,
            "max_position_embeddings": 140, "type_vocab_size": 2,
            "initializer_range": 0.05, "pad_token_id": 0}"#,
    )
    .unwrap();
    let m = Classifier::random(cfg, 3, 7).unwrap();
    let reserved = |fused: bool| {
        let k = Kernels::new(EmuTyped)
            .with_store(Dtype::Bf16)
            .with_fused_attention(fused);
        let params = k.upload(&m.params().data);
        let mut ws = Workspace::new();
        let before = k.allocations();
        m.reserve_on(&k, &mut ws, 1, 2, 130);
        (k.allocations() - before, k, params, ws)
    };
    let (unfused, ..) = reserved(false);
    let (fused, k, params, mut ws) = reserved(true);
    assert!(
        unfused > fused,
        "the scores' room, only where the products run: {unfused} allocations unfused, {fused} fused"
    );
    let before = k.allocations();
    assert!(EmuTyped.start_profile());
    for (i, seq) in [130, 100, 130].into_iter().enumerate() {
        m.forward_on(&k, &mut ws, &batch_of(2, seq, 40 + i as u64), &params)
            .unwrap();
    }
    let p = EmuTyped.profile().expect("started");
    assert_eq!(
        [
            calls(&p, "attention_fused"),
            calls(&p, "attention_fused_long"),
            calls(&p, "attention_softmax")
        ],
        [1, 2, 0],
        "100 keys through the short kernel, 130 through the long one"
    );
    assert_eq!(
        k.allocations(),
        before,
        "an evaluation on a reserved workspace allocated"
    );
}

/// With attention dropout the fused kernels draw the forward's mask again in the backward
/// (`Backend::attention_redraws_dropout`), so a training workspace for heads of 64 holds no
/// dropped probabilities: reserved, it takes as many allocations as without attention dropout,
/// where the batched products take one more a layer (their `probs_drop`); and a training pass
/// with dropout on it allocates nothing.
#[test]
fn the_fused_kernels_store_no_dropped_probabilities() {
    use recipe_kernel_emu::EmuTyped;
    let cfg = |p: f64| {
        BertConfig::from_json(&format!(
            r#"{{"vocab_size": 40, "hidden_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 2, "intermediate_size": 32,
                "max_position_embeddings": 20, "type_vocab_size": 2,
                "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": {p},
                "initializer_range": 0.05, "pad_token_id": 0}}"#
        ))
        .unwrap()
    };
    let reserve = |p: f64, fused: bool| {
        let m = Classifier::random(cfg(p), 3, 7).unwrap();
        let k = Kernels::new(EmuTyped)
            .with_store(Dtype::Bf16)
            .with_fused_attention(fused);
        let mut ws = Workspace::new();
        let before = k.allocations();
        m.reserve_on(&k, &mut ws, 2, 2, 16);
        (k.allocations() - before, m, k, ws)
    };
    let (fused, m, k, mut ws) = reserve(0.1, true);
    assert_eq!(
        fused,
        reserve(0.0, true).0,
        "fused, with and without attention dropout"
    );
    assert_eq!(
        reserve(0.1, false).0,
        reserve(0.0, false).0 + 2,
        "the batched products' dropped probabilities, one buffer a layer"
    );
    let params = k.upload(&m.params().data);
    let mut grads = k.alloc(m.num_params());
    let before = k.allocations();
    let key = Some(DropoutKey {
        seed: 3,
        micro_batch: 1,
    });
    m.forward_backward_on(
        &k,
        &mut ws,
        &batch_of(2, 16, 5),
        1.0,
        &params,
        &mut grads,
        key,
    )
    .unwrap();
    assert_eq!(k.allocations(), before, "a training pass allocated");
}

/// Optimizer offload's pipelined upload (`Resident::upload_params_part`): ranges of the
/// parameters queued one after another, of any length and offset, land where they belong; the
/// device refuses a range past its parameters (the caller then uploads the whole).
#[test]
fn parameter_ranges_queued_up_land_where_they_belong() {
    use recipe_runtime::model::OnDevice;
    use recipe_runtime::optim::device::{Accumulate, Keep, Resident};
    let dev = OnDevice::new(Kernels::new(Emu), "emulated GPU");
    let mut m = Classifier::random(tiny(0.0), 3, 7).unwrap();
    let keep = Keep {
        optimizer: None,
        accumulate: Accumulate::InPlace,
        partition: None,
    };
    dev.upload(&m, Dtype::F32, keep).unwrap();
    let n = m.num_params();
    let mut pinned = dev.pinned(n);
    for (i, x) in pinned.iter_mut().enumerate() {
        *x = i as f32 * 0.5 - 3.0;
    }
    for r in [0..n / 3, n / 3..n / 3 + 1, n / 3 + 1..n] {
        // SAFETY: `pinned` outlives the wait below and is not written before it.
        assert!(unsafe { dev.upload_params_part(r.start, &pinned[r]) });
    }
    // SAFETY: as above (refused, so nothing is queued).
    assert!(!unsafe { dev.upload_params_part(n - 1, &pinned[..2]) });
    dev.params_uploaded().unwrap();
    dev.download(&mut m, None, None).unwrap();
    assert!(m.params().data == pinned[..], "the parameters differ");
}

/// (loss, gradient) of one micro-batch `b` and its evaluation logits through the CUDA backend's
/// launch code on `dev`; with `half_params` the parameters are a buffer of the storage dtype, as
/// a device training from the optimizer's half working copy holds them (kernels/optim.rs).
fn on_device<D>(
    dev: D,
    store: Dtype,
    dropout: Option<DropoutKey>,
    half_params: bool,
    b: &Batch,
) -> (f32, Vec<f32>, Vec<f32>)
where
    D: recipe_runtime::backend::device::Device,
{
    let p = if dropout.is_some() { 0.2 } else { 0.0 };
    let mut m = Classifier::random(tiny(p), 3, 7).unwrap();
    store.round_slice(m.params_mut());
    let n = m.num_params();
    let k = Kernels::new(dev).with_store(store);
    let params = if half_params {
        let dev = k.device();
        let mut p = dev.alloc_half(n, store);
        assert_eq!(dev.elem(dev.view(&p)), store, "a 16-bit parameter buffer");
        dev.write(dev.view_mut(&mut p), &m.params().data);
        p
    } else {
        k.upload(&m.params().data)
    };
    let mut grads = k.alloc(n);
    let mut ws = Workspace::new();
    let loss = m
        .forward_backward_on(&k, &mut ws, b, 0.5, &params, &mut grads, dropout)
        .unwrap();
    let mut g = vec![0.0; n];
    k.download(k.view(&grads), &mut g);
    let logits = m.forward_on(&k, &mut ws, b, &params).unwrap();
    (loss, g, logits)
}

/// The buffers the model keeps in 16 bits on a device that can ([`Backend::alloc_stored`]:
/// the GELU's output and the gradient at its input) change no bit: the passes on the emulated
/// device with 16-bit buffers give the loss, gradient and logits of the one with f32 buffers,
/// in fp16 and bf16, with dropout; and so do 16-bit parameters (the optimizer's half working
/// copy). The 16-bit buffers take the kernels' vectorised paths (common.cuh, VEC) with either
/// parameter type, the f32 ones their generic paths; attention's softmax takes its vectorised
/// path for 8 keys, its generic one for 7.
#[test]
fn sixteen_bit_buffers_change_no_bit() {
    use recipe_kernel_emu::EmuTyped;
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for store in [Dtype::F16, Dtype::Bf16] {
        for dropout in [
            None,
            Some(DropoutKey {
                seed: 42,
                micro_batch: 3,
            }),
        ] {
            for b in [batch(), batch_with(2, 8, 11, |i| 8 - 3 * i, |i| i as u32)] {
                let (l32, g32, e32) = on_device(Emu, store, dropout, false, &b);
                for half_params in [false, true] {
                    let (l16, g16, e16) = on_device(EmuTyped, store, dropout, half_params, &b);
                    let what = format!(
                        "{store:?}, dropout {}, 16-bit parameters {half_params}, seq {}",
                        dropout.is_some(),
                        b.seq
                    );
                    assert_eq!(l16.to_bits(), l32.to_bits(), "loss, {what}");
                    assert!(bits(&g16) == bits(&g32), "gradient, {what}");
                    assert!(bits(&e16) == bits(&e32), "logits, {what}");
                }
            }
        }
    }
}

/// The word embeddings' rows first (`Kernels::with_rows_first`): each step's update of the first
/// segment put off to the next micro-batch, the rows its tokens name updated before its forward
/// and the rest beside it, or whole before an evaluation or a step with no micro-batch since
/// (`State::settle`). Windows of one and two micro-batches with dropout and clipping, an
/// evaluation after some steps, in fp32 and bf16: the same weights and logits, bit for bit, as
/// the step taken whole, with the two-part kernels launched once per part.
#[test]
fn the_word_embeddings_rows_first_train_to_the_same_bits() {
    use recipe_runtime::backend::device::Device;
    use recipe_runtime::collective::LocalCollective;
    use recipe_runtime::model::OnDevice;
    use recipe_runtime::optim::{Adam, AdamConfig};
    use recipe_runtime::zero::{Replica, Shard, Storage};

    let train = |store: Dtype, rows_first: bool| {
        let mut m = Classifier::random(tiny(0.1), 3, 7).unwrap();
        store.round_slice(m.params_mut());
        let k = Kernels::new(Emu)
            .with_store(store)
            .with_rows_first(rows_first);
        m.set_executor(OnDevice::new(k, "emulated GPU"));
        let shard = Shard::new(0, 1, 0, m.segments());
        let entries = &m.params().entries;
        let decay: Vec<bool> = entries.iter().map(|e| !e.name.ends_with("bias")).collect();
        let opt = Adam::shard(AdamConfig::adamw(0.01), entries, &decay, &shard.ranges).unwrap();
        let storage = Storage {
            module: store,
            comm: store,
        };
        let mut r = Replica::new(m, 0, 1, 0, opt, false, storage).unwrap();
        assert!(r.keep_on_device().unwrap() && r.optimizer_on_device());
        let mut coll = LocalCollective::group(1, std::time::Duration::from_secs(60))
            .pop()
            .unwrap();
        let mut ws = Workspace::new();
        let mut logits = Vec::new();
        assert!(Emu.start_profile());
        for (w, micro) in [1, 2, 1, 1, 2, 1].into_iter().enumerate() {
            r.start_window().unwrap();
            for i in 0..micro {
                let b = batch_with(3, 6, 10 * w as u64 + i, |j| 6 - j, |j| j as u32 % 3);
                let key = DropoutKey {
                    seed: 5,
                    micro_batch: (10 * w + i as usize) as u64,
                };
                r.micro(&mut coll, &mut ws, &b, 0.5, Some(key)).unwrap();
            }
            r.finish_window(&mut coll).unwrap();
            r.clip(&mut coll, 1.0).unwrap();
            r.step(&mut coll, 1e-2, 1.0).unwrap();
            if w == 2 || w == 4 {
                // Between a step and the next micro-batch: the put-off step first, whole.
                logits.push(r.model().forward(&batch()).unwrap());
            }
        }
        let p = Emu.profile().expect("started");
        r.gather_whole(&mut coll).unwrap();
        let parts = [
            calls(&p, "rows_mark"),
            calls(&p, "adamw_rows"),
            calls(&p, "rows_unmark"),
        ];
        (r.model().params().data.clone(), logits, parts)
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for store in [Dtype::F32, Dtype::Bf16] {
        let (whole, lw, none) = train(store, false);
        let (split, ls, parts) = train(store, true);
        assert_eq!(none, [0, 0, 0], "{store:?}: rows first when not asked");
        // Six steps: the first five taken by the next micro-batch in two parts, except the
        // two after which an evaluation came first; the last one never taken in parts (the
        // final gather settles it whole).
        assert_eq!(parts, [3, 6, 3], "{store:?}: the parts launched");
        assert_eq!(bits(&split), bits(&whole), "{store:?}: weights");
        assert_eq!(lw.len(), 2);
        for (a, b) in ls.iter().zip(&lw) {
            assert_eq!(bits(a), bits(b), "{store:?}: evaluation logits");
        }
    }
}
