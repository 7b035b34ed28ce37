//! Where the cursor is, read from the text alone: while a user types, the recipe usually does
//! not parse (`batch { mic`), so completion cannot wait for a syntax tree. A small scanner
//! follows the grammar's lexical rules (strings end at the line's end, `#` comments, `{ }`
//! nesting, `( )`/`[ ]` inside values, items separated by newlines or commas) over the text
//! before the cursor.

/// What is being typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Context {
    /// A block keyword at the start of a top-level line.
    BlockName,
    /// The word after a block keyword (`optimizer ad|`).
    Label {
        /// The block keyword.
        block: String,
    },
    /// A key inside a block's braces.
    Key {
        /// The block keyword.
        block: String,
        /// The block's label, if written.
        label: Option<String>,
        /// The raw sections the cursor is in (`zero_optimization` in `deepspeed { … }`).
        sections: Vec<String>,
    },
    /// A value after `key =`.
    Value {
        /// The block keyword.
        block: String,
        /// The block's label, if written.
        label: Option<String>,
        /// The raw sections the cursor is in.
        sections: Vec<String>,
        /// The key, words joined by one space.
        key: String,
        /// Whether the cursor is inside a string.
        in_string: bool,
    },
    /// Inside a comment, or somewhere nothing completes.
    Nothing,
}

/// The context at `offset`, and where the word being typed starts.
pub fn context(text: &str, offset: usize) -> (Context, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    // Frames: the words before each open `{`.
    let mut frames: Vec<Vec<String>> = Vec::new();
    let mut segment = 0usize; // where the current item (or top-level line) starts
    let mut depth = 0usize; // ( and [ nesting inside a value
    let mut in_string = false;
    let mut string_start = 0usize;
    let mut in_comment = false;
    let bytes = before.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_comment {
            if b == b'\n' {
                in_comment = false;
                segment = i + 1;
                depth = 0;
            }
            i += 1;
            continue;
        }
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                b'\n' => {
                    in_string = false;
                    segment = i + 1;
                    depth = 0;
                }
                _ => {}
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                string_start = i + 1;
            }
            b'#' => in_comment = true,
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth = depth.saturating_sub(1),
            b'{' => {
                frames.push(words(&before[segment..i]));
                segment = i + 1;
                depth = 0;
            }
            b'}' => {
                frames.pop();
                segment = i + 1;
                depth = 0;
            }
            b'\n' if depth == 0 => segment = i + 1,
            b',' if depth == 0 && !frames.is_empty() => segment = i + 1,
            _ => {}
        }
        i += 1;
    }
    if in_comment {
        return (Context::Nothing, offset);
    }
    let word_start = if in_string {
        string_start
    } else {
        before
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || *c == '_')
            .last()
            .map_or(offset, |(i, _)| i)
    };
    let seg = &before[segment..];
    if frames.is_empty() {
        // A top-level line: `kw` or `kw label`.
        let ws = words(seg);
        let typing_word =
            word_start < offset || seg.ends_with(char::is_whitespace) || seg.is_empty();
        if in_string || !typing_word {
            return (Context::Nothing, word_start);
        }
        let complete_words = if word_start < offset {
            ws.len() - 1
        } else {
            ws.len()
        };
        return match complete_words {
            0 => (Context::BlockName, word_start),
            1 if ws[0] != "target" => (
                Context::Label {
                    block: ws[0].clone(),
                },
                word_start,
            ),
            _ => (Context::Nothing, word_start),
        };
    }
    let header = &frames[0];
    let block = header.first().cloned().unwrap_or_default();
    let label = header.get(1).cloned();
    let sections: Vec<String> = frames[1..].iter().map(|f| f.join(".")).collect();
    match seg.find('=') {
        Some(eq) => {
            let key = words(&seg[..eq]).join(" ");
            (
                Context::Value {
                    block,
                    label,
                    sections,
                    key,
                    in_string,
                },
                word_start,
            )
        }
        None if in_string => (Context::Nothing, word_start),
        None => (
            Context::Key {
                block,
                label,
                sections,
            },
            word_start,
        ),
    }
}

/// The words of a header or key (identifiers and labels; quotes dropped), with dotted keys
/// split into their parts joined back by `.`.
fn words(s: &str) -> Vec<String> {
    s.split_whitespace()
        .map(|w| w.trim_matches('"').to_string())
        .filter(|w| !w.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Context {
        let offset = text.find('|').unwrap();
        let text = text.replace('|', "");
        context(&text, offset).0
    }

    #[test]
    fn contexts() {
        assert_eq!(at("recipe \"x\"\nba|"), Context::BlockName);
        assert_eq!(at("|"), Context::BlockName);
        assert_eq!(
            at("optimizer ad|"),
            Context::Label {
                block: "optimizer".into()
            }
        );
        assert_eq!(
            at("batch { micro = 16, acc| }"),
            Context::Key {
                block: "batch".into(),
                label: None,
                sections: vec![]
            }
        );
        assert_eq!(
            at("train {\n  precision = b|\n}"),
            Context::Value {
                block: "train".into(),
                label: None,
                sections: vec![],
                key: "precision".into(),
                in_string: false
            }
        );
        assert_eq!(
            at("zero 2 { offload  optimizer = |"),
            Context::Value {
                block: "zero".into(),
                label: Some("2".into()),
                sections: vec![],
                key: "offload optimizer".into(),
                in_string: false
            }
        );
        assert_eq!(
            at("deepspeed {\n  zero_optimization {\n    st|"),
            Context::Key {
                block: "deepspeed".into(),
                label: None,
                sections: vec!["zero_optimization".into()]
            }
        );
        assert_eq!(
            at("data { text = \"te|"),
            Context::Value {
                block: "data".into(),
                label: None,
                sections: vec![],
                key: "text".into(),
                in_string: true
            }
        );
        // A comma inside a call does not end the item; a comment completes nothing.
        assert!(matches!(
            at("model bert { task = classify(labels: 2, |"),
            Context::Value { .. }
        ));
        assert_eq!(at("batch { micro = 16 } # ba|"), Context::Nothing);
        // After the closing brace: top level again.
        assert_eq!(at("batch { micro = 16 }\n|"), Context::BlockName);
    }
}
