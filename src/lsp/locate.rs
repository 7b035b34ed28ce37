//! What is at an offset of a parsed recipe: a block keyword, a block's label, a key or a value.

use crate::syntax::ast::{Block, Entry, File, Item, Span};

/// The node under the cursor.
#[derive(Debug)]
pub enum Spot<'a> {
    /// A block keyword (`optimizer` in `optimizer adamw { … }`).
    BlockName(&'a Block),
    /// A block's label (`adamw`).
    Label(&'a Block),
    /// An entry's key; `path` is the key within the block, with enclosing raw sections joined
    /// by `.` (`zero_optimization.stage`).
    Key {
        /// The block.
        block: &'a Block,
        /// The key path.
        path: String,
        /// Its span.
        span: Span,
    },
    /// An item's value.
    Value {
        /// The block.
        block: &'a Block,
        /// The key path.
        path: String,
        /// The item.
        item: &'a Item,
    },
}

fn inside(span: Span, offset: usize) -> bool {
    // A cursor right after a word still names it (editors hover at the word's end too).
    span.start <= offset && offset <= span.end
}

/// The node at `offset`, if any.
pub fn locate(file: &File, offset: usize) -> Option<Spot<'_>> {
    let block = file
        .blocks
        .iter()
        .find(|b| b.span.start <= offset && offset <= b.span.end)?;
    if inside(block.name.span, offset) {
        return Some(Spot::BlockName(block));
    }
    if let Some(label) = &block.label {
        if inside(label.span, offset) {
            return Some(Spot::Label(block));
        }
    }
    let body = block.body.as_ref()?;
    entries(block, &body.entries, String::new(), offset)
}

fn entries<'a>(
    block: &'a Block,
    entries: &'a [Entry],
    prefix: String,
    offset: usize,
) -> Option<Spot<'a>> {
    let entry = entries
        .iter()
        .find(|e| e.span().start <= offset && offset <= e.span().end)?;
    let key = entry.key();
    let path = if prefix.is_empty() {
        key.text.clone()
    } else {
        format!("{prefix}.{}", key.text)
    };
    if inside(key.span, offset) {
        return Some(Spot::Key {
            block,
            path,
            span: key.span,
        });
    }
    match entry {
        Entry::Item(item) if inside(item.value.span, offset) => {
            Some(Spot::Value { block, path, item })
        }
        Entry::Item(_) => None,
        Entry::Section(section) => self::entries(block, &section.body.entries, path, offset),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_keys_values_labels_and_raw_paths() {
        let text = "optimizer adamw { lr = 3e-5 }\ndeepspeed { zero_optimization { stage = 2 } }\n";
        let file = crate::syntax::parse(text).unwrap();
        let at = |needle: &str| text.find(needle).unwrap() + 1;
        assert!(matches!(
            locate(&file, at("optimizer")),
            Some(Spot::BlockName(_))
        ));
        assert!(matches!(locate(&file, at("adamw")), Some(Spot::Label(_))));
        assert!(matches!(locate(&file, at("lr")), Some(Spot::Key { path, .. }) if path == "lr"));
        assert!(
            matches!(locate(&file, at("3e-5")), Some(Spot::Value { path, .. }) if path == "lr")
        );
        assert!(
            matches!(locate(&file, at("stage")), Some(Spot::Key { path, .. }) if path == "zero_optimization.stage")
        );
        assert!(locate(&file, at("{ lr") - 1).is_none());
    }
}
