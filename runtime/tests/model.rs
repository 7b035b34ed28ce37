//! Model behaviour that PyTorch cannot check bit-for-bit: dropout (our Philox masks), HF-style
//! random initialisation, thread-count invariance, padding edge cases, and a speed figure.

use recipe_runtime::backend::Cpu;
use recipe_runtime::model::{Batch, BertConfig, Classifier, DropoutKey, Workspace};
use recipe_runtime::rng::Rng;

fn tiny_config(dropout: f64) -> BertConfig {
    BertConfig::from_json(&format!(
        r#"{{"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 24, "max_position_embeddings": 20,
            "type_vocab_size": 2, "hidden_dropout_prob": {dropout},
            "attention_probs_dropout_prob": {dropout}, "initializer_range": 0.3,
            "pad_token_id": 0, "some_future_field": [1, 2]}}"#
    ))
    .unwrap()
}

fn random_batch(seed: u64, batch: usize, seq: usize, vocab: u32, labels: u32) -> Batch {
    let mut r = Rng::new(seed, 1);
    let mut b = Batch {
        batch,
        seq,
        ..Batch::default()
    };
    for i in 0..batch {
        let len = if i == 0 {
            seq
        } else {
            1 + r.below(seq as u64) as usize
        };
        for t in 0..seq {
            let real = t < len;
            b.input_ids.push(if real {
                1 + r.below(u64::from(vocab) - 1) as u32
            } else {
                0
            });
            b.token_type_ids.push(u32::from(real && t >= len / 2));
            b.attention_mask.push(u32::from(real));
        }
        b.labels.push(r.below(u64::from(labels)) as u32);
    }
    b
}

#[test]
fn random_init_follows_hf_init_weights() {
    let m = Classifier::random(tiny_config(0.0), 3, 5).unwrap();
    let p = m.params();
    let word = p.get("bert.embeddings.word_embeddings.weight").unwrap();
    assert!(word[..16].iter().all(|&x| x == 0.0), "pad row zeroed");
    let std = (word[16..]
        .iter()
        .map(|x| f64::from(*x).powi(2))
        .sum::<f64>()
        / (word.len() - 16) as f64)
        .sqrt();
    assert!((0.27..0.33).contains(&std), "{std}");
    for e in &p.entries {
        let v = &p.data[e.range()];
        if e.name.ends_with("LayerNorm.weight") {
            assert!(v.iter().all(|&x| x == 1.0), "{}", e.name);
        } else if e.name.ends_with(".bias") {
            assert!(v.iter().all(|&x| x == 0.0), "{}", e.name);
        } else {
            assert!(v.iter().any(|&x| x != 0.0), "{}", e.name);
        }
    }
    // Seeded and per-tensor: same seed same weights; another seed different weights.
    assert_eq!(
        Classifier::random(tiny_config(0.0), 3, 5).unwrap().params(),
        p
    );
    assert_ne!(
        Classifier::random(tiny_config(0.0), 3, 6).unwrap().params(),
        p
    );
    // A different label count changes only the head: every other tensor keeps its stream.
    let four = Classifier::random(tiny_config(0.0), 4, 5).unwrap();
    for e in p
        .entries
        .iter()
        .filter(|e| !e.name.starts_with("classifier"))
    {
        assert_eq!(four.params().get(&e.name).unwrap(), &p.data[e.range()]);
    }
    assert!(Classifier::random(tiny_config(0.0), 1, 5).is_err());
}

#[test]
fn dropout_gradients_match_finite_differences() {
    // With a fixed key the loss is a deterministic function of the parameters, so the analytic
    // gradient (masks re-derived in backward) must match central differences.
    let mut m = Classifier::random(tiny_config(0.2), 3, 1).unwrap();
    let b = random_batch(2, 3, 7, 50, 3);
    let key = Some(DropoutKey {
        seed: 11,
        micro_batch: 4,
    });
    let mut ws = Workspace::new();
    let mut g = m.params().zeros_like();
    let loss = m.forward_backward(&mut ws, &b, 1.0, &mut g, key).unwrap();
    // Dropout actually changes the loss.
    let mut g0 = m.params().zeros_like();
    let plain = m.forward_backward(&mut ws, &b, 1.0, &mut g0, None).unwrap();
    assert!((loss - plain).abs() > 1e-4, "{loss} vs {plain}");

    let mut r = Rng::new(3, 3);
    let names: Vec<(String, std::ops::Range<usize>)> = m
        .params()
        .entries
        .iter()
        .filter(|e| !e.name.ends_with("key.bias"))
        .map(|e| (e.name.clone(), e.range()))
        .collect();
    let mut scratch = m.params().zeros_like();
    let mut worst = 0.0f64;
    for (name, range) in &names {
        // The coordinate with the largest gradient in the tensor, plus a random one.
        let (imax, _) = g[range.clone()]
            .iter()
            .enumerate()
            .fold((0, 0.0f32), |acc, (i, &x)| {
                if x.abs() > acc.1 {
                    (i, x.abs())
                } else {
                    acc
                }
            });
        for i in [
            range.start + imax,
            range.start + r.below(range.len() as u64) as usize,
        ] {
            let h = 1e-2f32;
            let orig = m.params().data[i];
            let mut f = |v: f32, m: &mut Classifier| {
                m.params_mut()[i] = v;
                f64::from(
                    m.forward_backward(&mut ws, &b, 1.0, &mut scratch, key)
                        .unwrap(),
                )
            };
            let num = (f(orig + h, &mut m) - f(orig - h, &mut m)) / (2.0 * f64::from(h));
            m.params_mut()[i] = orig;
            let ana = f64::from(g[i]);
            let err = (num - ana).abs() / ana.abs().max(1e-2);
            worst = worst.max(err);
            assert!(
                err < 2e-2,
                "{name}[{}]: numeric {num}, analytic {ana}",
                i - range.start
            );
        }
    }
    println!("dropout finite-difference check: worst relative error {worst:.1e}");
}

#[test]
fn results_do_not_depend_on_thread_count_and_repeat_exactly() {
    // Big enough that the threaded GEMM path (m·n·k ≥ 2^21) and per-sequence attention split run.
    let cfg = BertConfig::from_json(
        r#"{"vocab_size": 300, "hidden_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 256,
            "max_position_embeddings": 64}"#,
    )
    .unwrap();
    let mut m = Classifier::random(cfg, 2, 9).unwrap();
    let b = random_batch(4, 6, 64, 300, 2);
    let key = Some(DropoutKey {
        seed: 1,
        micro_batch: 0,
    });
    let run = |m: &Classifier| {
        let mut g = m.params().zeros_like();
        let l = m
            .forward_backward(&mut Workspace::new(), &b, 0.5, &mut g, key)
            .unwrap();
        (l, g)
    };
    let one = run(&m);
    assert_eq!(one, run(&m), "repeatable");
    m.set_backend(Cpu::new(3));
    assert_eq!(one, run(&m), "thread count changed bits");
}

#[test]
fn padding_never_produces_nan() {
    let m = Classifier::random(tiny_config(0.1), 2, 3).unwrap();
    let mut b = random_batch(5, 3, 6, 50, 2);
    // Row 2 entirely padding (HF then attends uniformly over the masked keys).
    for t in 0..6 {
        b.attention_mask[2 * 6 + t] = 0;
        b.input_ids[2 * 6 + t] = 0;
    }
    let logits = m.forward(&b).unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));
    let mut g = m.params().zeros_like();
    let l = m
        .forward_backward(&mut Workspace::new(), &b, 1.0, &mut g, None)
        .unwrap();
    assert!(l.is_finite() && g.iter().all(|x| x.is_finite()));
}

#[test]
fn saved_config_round_trips_unknown_fields() {
    let m = Classifier::random(tiny_config(0.0), 2, 3).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("out");
    m.save_pretrained(&dir, &["no".into(), "yes".into()])
        .unwrap();
    let back = Classifier::from_pretrained(&dir, 2, 0).unwrap();
    assert_eq!(back.params(), m.params());
    assert_eq!(
        back.config().extra["some_future_field"],
        serde_json::json!([1, 2])
    );
    let mut want = m.config().clone();
    for (k, v) in &back.config().extra {
        want.extra.entry(k.clone()).or_insert(v.clone());
    }
    assert_eq!(back.config(), &want);
    assert!(m
        .save_pretrained(&dir, &["only one".into()])
        .unwrap_err()
        .to_string()
        .contains("1 label names for 2 labels"));
}

/// Speed figure for the MiniLM-L6 shape: `cargo test --release -p recipe-runtime --test suite
/// -- --ignored --nocapture model::minilm`. `RECIPE_THREADS` sets the thread count (default 1).
#[test]
#[ignore]
fn minilm_l6_forward_backward_speed() {
    let cfg = BertConfig::from_json(
        r#"{"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
            "num_attention_heads": 12, "intermediate_size": 1536,
            "max_position_embeddings": 512}"#,
    )
    .unwrap();
    let threads: usize = std::env::var("RECIPE_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut m = Classifier::random(cfg, 2, 0).unwrap();
    m.set_backend(Cpu::new(threads));
    let mut ws = Workspace::new();
    let mut g = m.params().zeros_like();
    for seq in [64, 128] {
        let b = random_batch(7, 16, seq, 30522, 2);
        let key = |i| {
            Some(DropoutKey {
                seed: 0,
                micro_batch: i,
            })
        };
        m.forward_backward(&mut ws, &b, 1.0, &mut g, key(0))
            .unwrap(); // warm-up
        let n = 3;
        let t0 = std::time::Instant::now();
        for i in 0..n {
            m.forward_backward(&mut ws, &b, 1.0, &mut g, key(i + 1))
                .unwrap();
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3 / n as f64;
        println!(
            "MiniLM-L6 batch 16 seq {seq}, {threads} thread(s): {ms:.0} ms per forward_backward"
        );
    }
}
