//! Where a device's time goes: each operation's calls and seconds, by name (a kernel's name,
//! `cublas …` for a GEMM, `memcpy …`/`memset` for the copies), for `recipe run --profile`.
//!
//! A GPU times each operation between two CUDA events on its stream (so only the GPU's work
//! counts, not the host's launch), the emulated device by the host's clock around the call (it
//! runs them synchronously). The report also gives the time the device was busy against the
//! time that passed: a device idle most of the run waits on its host (launches, copies,
//! synchronisations), which is what CUDA graphs and fewer synchronisations would recover; one
//! busy throughout is bound by the operations the table lists (docs/cuda.md, "Profiling").

use std::collections::BTreeMap;

/// One operation's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Row {
    pub calls: u64,
    pub seconds: f64,
}

/// Totals by operation name, and the time they were measured over.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    rows: BTreeMap<&'static str, Row>,
    /// Seconds from the first operation's start to the last one's end, on the device's clock:
    /// the window in which the device had work, whatever the host did before and after.
    pub span: f64,
}

impl Profile {
    /// Counts one call of `name` that took `seconds`.
    pub fn add(&mut self, name: &'static str, seconds: f64) {
        let r = self.rows.entry(name).or_default();
        r.calls += 1;
        r.seconds += seconds;
    }

    /// Adds another device's totals (the ranks of a run): calls and seconds summed, the longer
    /// span kept.
    pub fn merge(&mut self, other: &Profile) {
        for (name, r) in &other.rows {
            let mine = self.rows.entry(name).or_default();
            mine.calls += r.calls;
            mine.seconds += r.seconds;
        }
        self.span = self.span.max(other.span);
    }

    /// Seconds the device spent in any operation.
    pub fn busy(&self) -> f64 {
        // A fold from +0 (an empty `sum` of floats is -0, which prints as "-0.000").
        self.rows.values().fold(0.0, |a, r| a + r.seconds)
    }

    /// Calls of every operation.
    pub fn calls(&self) -> u64 {
        self.rows.values().map(|r| r.calls).sum()
    }

    /// The rows, the most time first (ties by name, so the order is stable).
    pub fn rows(&self) -> Vec<(&'static str, Row)> {
        let mut v: Vec<_> = self.rows.iter().map(|(n, r)| (*n, *r)).collect();
        v.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds).then(a.0.cmp(b.0)));
        v
    }

    /// The profile as JSON: `busy_s`, `span_s`, `calls` and the rows (name, calls, seconds,
    /// share of the busy time, mean microseconds per call).
    pub fn to_json(&self) -> serde_json::Value {
        let busy = self.busy();
        let rows: Vec<serde_json::Value> = self
            .rows()
            .into_iter()
            .map(|(name, r)| {
                serde_json::json!({
                    "name": name,
                    "calls": r.calls,
                    "seconds": r.seconds,
                    "share": if busy > 0.0 { r.seconds / busy } else { 0.0 },
                    "mean_us": if r.calls > 0 { 1e6 * r.seconds / r.calls as f64 } else { 0.0 },
                })
            })
            .collect();
        serde_json::json!({
            "busy_s": busy,
            "span_s": self.span,
            "calls": self.calls(),
            "rows": rows,
        })
    }

    /// The `top` rows as a table, then the rest in one line and the busy/span summary.
    pub fn table(&self, top: usize) -> String {
        let busy = self.busy();
        let share = |s: f64| if busy > 0.0 { 100.0 * s / busy } else { 0.0 };
        let mut out = format!(
            "{:<28} {:>9} {:>11} {:>7} {:>10}\n",
            "operation", "calls", "seconds", "share", "mean µs"
        );
        let rows = self.rows();
        for (name, r) in rows.iter().take(top) {
            out.push_str(&format!(
                "{:<28} {:>9} {:>11.4} {:>6.1}% {:>10.1}\n",
                name,
                r.calls,
                r.seconds,
                share(r.seconds),
                1e6 * r.seconds / r.calls.max(1) as f64
            ));
        }
        if rows.len() > top {
            let rest = &rows[top..];
            let (calls, secs) = rest
                .iter()
                .fold((0, 0.0), |(c, s), (_, r)| (c + r.calls, s + r.seconds));
            out.push_str(&format!(
                "{:<28} {:>9} {:>11.4} {:>6.1}%\n",
                format!("({} others)", rest.len()),
                calls,
                secs,
                share(secs)
            ));
        }
        let busy_share = if self.span > 0.0 {
            format!(
                " ({:.0}% of the {:.3} s from the first operation to the last)",
                100.0 * busy / self.span,
                self.span
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "device busy {busy:.3} s{busy_share} over {} operations\n",
            self.calls()
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Profile {
        let mut p = Profile::default();
        p.add("pack_half", 0.5);
        p.add("cublas gemm bf16", 1.0);
        p.add("pack_half", 0.25);
        p.add("layernorm_fwd", 0.25);
        p.span = 4.0;
        p
    }

    #[test]
    fn rows_sum_by_name_most_time_first() {
        let p = sample();
        let rows = p.rows();
        assert_eq!(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            ["cublas gemm bf16", "pack_half", "layernorm_fwd"]
        );
        assert_eq!(
            rows[1].1,
            Row {
                calls: 2,
                seconds: 0.75
            }
        );
        assert_eq!(p.busy(), 2.0);
        assert_eq!(p.calls(), 4);
    }

    #[test]
    fn ranks_merge_into_sums_and_the_longest_span() {
        let mut a = sample();
        let mut b = Profile::default();
        b.add("pack_half", 1.0);
        b.add("memset", 0.5);
        b.span = 5.0;
        a.merge(&b);
        assert_eq!(
            a.rows()[0],
            (
                "pack_half",
                Row {
                    calls: 3,
                    seconds: 1.75
                }
            )
        );
        assert_eq!(a.busy(), 3.5);
        assert_eq!(a.span, 5.0);
    }

    #[test]
    fn json_and_table_report_shares_and_means() {
        let p = sample();
        let j = p.to_json();
        assert_eq!(j["busy_s"], 2.0);
        assert_eq!(j["span_s"], 4.0);
        assert_eq!(j["rows"][0]["name"], "cublas gemm bf16");
        assert_eq!(j["rows"][0]["share"], 0.5);
        assert_eq!(j["rows"][1]["mean_us"], 375_000.0);
        let t = p.table(2);
        assert!(t.contains("cublas gemm bf16"), "{t}");
        assert!(t.contains("(1 others)"), "{t}");
        assert!(!t.contains("layernorm_fwd"), "{t}");
        assert!(
            t.contains("device busy 2.000 s (50% of the 4.000 s from the first operation to the last) over 4 operations"),
            "{t}"
        );
        assert!(Profile::default()
            .table(5)
            .contains("device busy 0.000 s over 0"));
    }
}
