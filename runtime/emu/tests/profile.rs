//! `recipe run --profile`'s plumbing on the emulated device: an executor's profile counts each
//! kernel the model launches, by name, as often as the model launches it.

use recipe_kernel_emu::Emu;
use recipe_runtime::backend::kernels::Kernels;
use recipe_runtime::model::{Batch, BertConfig, Classifier, Executor, OnDevice};
use recipe_runtime::precision::Dtype;

fn tiny(layers: usize) -> BertConfig {
    BertConfig::from_json(&format!(
        r#"{{"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": {layers},
            "num_attention_heads": 2, "intermediate_size": 24, "max_position_embeddings": 12,
            "type_vocab_size": 2, "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0, "initializer_range": 0.3,
            "pad_token_id": 0}}"#
    ))
    .unwrap()
}

fn batch() -> Batch {
    let (bsz, seq) = (2, 5);
    Batch {
        batch: bsz,
        seq,
        input_ids: (0..bsz * seq).map(|i| 1 + (i as u32 * 7) % 39).collect(),
        token_type_ids: vec![0; bsz * seq],
        attention_mask: (0..bsz * seq).map(|i| u32::from(i % seq < 4)).collect(),
        labels: vec![1, 2],
    }
}

#[test]
fn the_profile_counts_every_kernel_the_passes_launch() {
    for layers in [1, 3] {
        let m = Classifier::random(tiny(layers), 3, 7).unwrap();
        let ex = OnDevice::new(Kernels::new(Emu).with_store(Dtype::Bf16), "emulated GPU");
        let ex: &dyn Executor = &*ex;
        let mut grads = vec![0.0; m.num_params()];
        let b = batch();
        // Not started (on this thread, which the emulator's profile belongs to): nothing.
        assert_eq!(ex.profile().is_none(), layers == 1);
        // Starting again starts from zero.
        assert!(ex.start_profile());
        for pass in 1..=2u64 {
            ex.forward_backward(&m, &b, 1.0, &mut grads, None).unwrap();
            let p = ex.profile().expect("started");
            let calls = |name: &str| {
                p.rows()
                    .iter()
                    .find(|r| r.0 == name)
                    .map_or(0, |r| r.1.calls)
            };
            let l = layers as u64;
            // The embeddings' LayerNorm, then two per layer.
            assert_eq!(
                calls("layernorm_fwd"),
                pass * (1 + 2 * l),
                "{layers} layers"
            );
            assert_eq!(calls("layernorm_bwd_dinp"), pass * (1 + 2 * l));
            assert_eq!(calls("attention_softmax"), pass * l);
            assert_eq!(calls("attention_softmax_bwd"), pass * l);
            assert_eq!(calls("cross_entropy"), pass);
            // Per layer six linears forward; backward two GEMMs each for the three after
            // attention and two for q, k and v together (their weights' and the input's, each
            // over the rows of dq, dk and dv: bert.rs, `qkv_matrix`); attention's two products
            // forward and four backward, one GEMM per (sequence, head) here (a GPU batches
            // them); the pooler and the classifier three each.
            let heads = (b.batch * 2) as u64;
            assert_eq!(calls("gemm"), pass * (l * (6 + 8 + 6 * heads) + 6));
            assert!(p.busy() <= p.span, "{} busy of {} s", p.busy(), p.span);
        }
    }
}
