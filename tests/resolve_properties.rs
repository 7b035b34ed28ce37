//! Properties of resolution: for any recipe that checks clean, the resolved batch triple satisfies
//! `global = micro × accumulate × world`, and the predicted total equals the sum over epochs
//! (and, on current versions, the optimizer steps the simulated timeline takes).

use proptest::prelude::*;
use recipe::check::check_source_with;
use recipe::resolve::{resolve, Options};
use recipe::rules::steps::{run_summary, run_timeline};

#[allow(clippy::too_many_arguments)]
fn recipe_text(
    micro: Option<u32>,
    accumulate: Option<u32>,
    global: Option<u32>,
    gpus: u32,
    nodes: u32,
    samples: u32,
    epochs: u32,
    drop_last: bool,
) -> String {
    let mut batch = Vec::new();
    if let Some(m) = micro {
        batch.push(format!("micro = {m}"));
    }
    if let Some(a) = accumulate {
        batch.push(format!("accumulate = {a}"));
    }
    if let Some(g) = global {
        batch.push(format!("global = {g}"));
    }
    format!(
        "model bert {{ from = \"m\", task = classify(labels: 2) }}\n\
         data {{ train = \"t.jsonl\", samples = {samples}, drop_last = {drop_last} }}\n\
         batch {{ {} }}\n\
         train {{ epochs = {epochs} }}\n\
         cluster {{ gpus = {gpus}, nodes = {nodes} }}\n",
        batch.join(", ")
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, max_global_rejects: 20_000, ..ProptestConfig::default() })]

    #[test]
    fn clean_recipes_satisfy_the_batch_invariant_and_step_sums(
        micro in prop::option::of(1u32..33),
        accumulate in prop::option::of(1u32..9),
        global in prop::option::of(1u32..2049),
        gpus in 1u32..9,
        nodes in 1u32..4,
        samples in 1u32..5000,
        epochs in 1u32..4,
        drop_last in any::<bool>(),
        newest in any::<bool>(),
    ) {
        prop_assume!(micro.is_some() || global.is_some());
        let text = recipe_text(micro, accumulate, global, gpus, nodes, samples, epochs, drop_last);
        let mut options = Options::default();
        if !newest {
            options.targets.push((recipe::upstream::versions::Library::Transformers, "4.40.0".parse().unwrap()));
        }
        let checked = check_source_with(&text, &options);
        prop_assume!(!checked.has_errors());
        let r = resolve(checked.file.as_ref().unwrap(), &options);
        let (mb, gas, tb, world) = (
            r.int("batch.micro").unwrap(),
            r.int("batch.accumulate").unwrap(),
            r.int("batch.global").unwrap(),
            r.int("cluster.world_size").unwrap(),
        );
        prop_assert_eq!(world, i64::from(gpus * nodes));
        prop_assert_eq!(tb, mb * gas * world, "{}", text);
        let (u, total) = (r.uint("steps.per_epoch").unwrap(), r.uint("steps.total").unwrap());
        prop_assert_eq!(total, u * u64::from(epochs));
        if newest {
            let rows = run_timeline(&r, u64::MAX).unwrap();
            let hf_steps = rows.last().unwrap().hf_global;
            prop_assert_eq!(hf_steps, total, "{}", text);
            // The summary (what the checker reads) lands on the same last micro-batch.
            prop_assert_eq!(run_summary(&r).unwrap().last, rows.last().copied());
            // Per epoch: exactly U steps each.
            for e in 1..=u64::from(epochs) {
                let in_epoch = rows.iter().filter(|x| x.epoch == e && x.hf_step).count() as u64;
                prop_assert_eq!(in_epoch, u);
            }
        }
    }
}
