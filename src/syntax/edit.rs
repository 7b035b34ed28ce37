//! Text edits on a parsed recipe, for the fixes diagnostics carry.

use super::ast::{Body, Comment, Span};

/// What to delete to remove the `index`-th entry of `body`: the entry with the separator that
/// joins it to its neighbour (`micro = 8, ` or `, accumulate = 2`), so that no stray comma is left.
/// A comment between the entry and that neighbour is kept: then only the entry itself goes.
pub fn removal_span(body: &Body, index: usize, comments: &[Comment]) -> Span {
    let entry = body.entries[index].span();
    let wider = if let Some(next) = body.entries.get(index + 1) {
        Span::new(entry.start, next.span().start)
    } else if index > 0 {
        Span::new(body.entries[index - 1].span().end, entry.end)
    } else {
        entry
    };
    let crosses = comments
        .iter()
        .any(|c| c.span.start < wider.end && c.span.end > wider.start);
    if crosses {
        entry
    } else {
        wider
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remove(text: &str, block: usize, index: usize) -> String {
        let file = crate::syntax::parse(text).unwrap();
        let body = file.blocks[block].body.as_ref().unwrap();
        let span = removal_span(body, index, &file.comments);
        let mut out = text.to_string();
        out.replace_range(span.start..span.end, "");
        out
    }

    #[test]
    fn removes_the_separator_with_the_entry() {
        assert_eq!(
            remove("batch { micro = 8, accumulate = 2 }", 0, 0),
            "batch { accumulate = 2 }"
        );
        assert_eq!(
            remove("batch { micro = 8, accumulate = 2 }", 0, 1),
            "batch { micro = 8 }"
        );
        assert_eq!(remove("batch { micro = 8 }", 0, 0), "batch {  }");
        assert_eq!(
            remove("batch {\n  micro = 8\n  accumulate = 2\n}", 0, 1),
            "batch {\n  micro = 8\n}"
        );
        // A comment in between stays.
        assert_eq!(
            remove("batch {\n  micro = 8  # per GPU\n  accumulate = 2\n}", 0, 0),
            "batch {\n    # per GPU\n  accumulate = 2\n}"
        );
    }
}
