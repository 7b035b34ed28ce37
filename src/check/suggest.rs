//! Did-you-mean: the closest known name to a misspelt one.

/// The candidate closest to `word`, if one is close enough to be a likely typo.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = word.to_lowercase();
    let mut best: Option<(usize, f64, &'a str)> = None;
    for candidate in candidates {
        let cand = candidate.to_lowercase();
        if cand == lower {
            return Some(candidate);
        }
        let distance = strsim::damerau_levenshtein(&lower, &cand);
        let similarity = strsim::jaro_winkler(&lower, &cand);
        let limit = (lower.chars().count().min(cand.chars().count()) / 3).max(1);
        let contained = lower.len() >= 4 && (cand.contains(&lower) || lower.contains(&cand));
        if distance <= limit || similarity >= 0.9 || contained {
            let better = match best {
                None => true,
                Some((d, s, _)) => distance < d || (distance == d && similarity > s),
            };
            if better {
                best = Some((distance, similarity, candidate));
            }
        }
    }
    best.map(|(_, _, c)| c)
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn finds_typos_and_case_slips() {
        let keys = ["micro", "accumulate", "global", "eval_micro"];
        assert_eq!(closest("acumulate", keys), Some("accumulate"));
        assert_eq!(closest("micr", keys), Some("micro"));
        assert_eq!(closest("Global", keys), Some("global"));
        assert_eq!(closest("zzz", keys), None);
        assert_eq!(
            closest("warmupdecaylr", ["WarmupLR", "WarmupDecayLR"]),
            Some("WarmupDecayLR")
        );
    }
}
