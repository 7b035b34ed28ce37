//! One open document: its text, version, and the conversions between the byte offsets the
//! compiler's spans use and the client's positions (line + column in UTF-16 code units by
//! default, UTF-8 bytes when the client offers it; LSP 3.17 `positionEncoding`).

use line_index::{LineCol, LineIndex, TextSize, WideEncoding, WideLineCol};
use lsp_types::{Position, Range, TextDocumentContentChangeEvent};

use crate::syntax::ast::Span;

/// How the client counts columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Bytes of UTF-8 (negotiated).
    Utf8,
    /// UTF-16 code units (the protocol's default).
    Utf16,
}

/// An open document.
#[derive(Debug)]
pub struct Document {
    text: String,
    /// The client's version of the text.
    pub version: i32,
    index: LineIndex,
}

impl Document {
    /// A document with this text.
    pub fn new(text: String, version: i32) -> Self {
        let index = LineIndex::new(&text);
        Document {
            text,
            version,
            index,
        }
    }

    /// The current text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The byte offset of a client position. A column past the line's end means the line's end
    /// (LSP: "defaults back to the line length"); a line past the last is the end of the text;
    /// a UTF-16 column inside a surrogate pair snaps back to the character's start.
    pub fn offset(&self, pos: Position, enc: Encoding) -> usize {
        let Some(range) = self.index.line(pos.line) else {
            return self.text.len();
        };
        let (start, end) = (usize::from(range.start()), usize::from(range.end()));
        // The line's text without its line break.
        let line = self.text[start..end].trim_end_matches(['\n', '\r']);
        let mut col = 0usize; // in the client's units
        for (i, ch) in line.char_indices() {
            if col >= pos.character as usize {
                return start + i;
            }
            col += match enc {
                Encoding::Utf8 => ch.len_utf8(),
                Encoding::Utf16 => ch.len_utf16(),
            };
            if col > pos.character as usize {
                // Inside this character: its start.
                return start + i;
            }
        }
        start + line.len()
    }

    /// The client position of a byte offset (clamped to the text, snapped to a character
    /// boundary).
    pub fn position(&self, offset: usize) -> LineCol {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        self.index.line_col(TextSize::new(offset as u32))
    }

    /// The client position of a byte offset in the negotiated encoding.
    pub fn lsp_position(&self, offset: usize, enc: Encoding) -> Position {
        let lc = self.position(offset);
        match enc {
            Encoding::Utf8 => Position::new(lc.line, lc.col),
            Encoding::Utf16 => {
                let w = self
                    .index
                    .to_wide(WideEncoding::Utf16, lc)
                    .unwrap_or(WideLineCol {
                        line: lc.line,
                        col: lc.col,
                    });
                Position::new(w.line, w.col)
            }
        }
    }

    /// The client range of a span.
    pub fn range(&self, span: Span, enc: Encoding) -> Range {
        Range::new(
            self.lsp_position(span.start, enc),
            self.lsp_position(span.end, enc),
        )
    }

    /// The span of a client range.
    pub fn span(&self, range: Range, enc: Encoding) -> Span {
        let start = self.offset(range.start, enc);
        let end = self.offset(range.end, enc).max(start);
        Span::new(start, end)
    }

    /// Applies one change (a range replaced, or the whole text when there is no range).
    pub fn apply(&mut self, change: TextDocumentContentChangeEvent, enc: Encoding) {
        match change.range {
            None => self.text = change.text,
            Some(range) => {
                let span = self.span(range, enc);
                self.text.replace_range(span.start..span.end, &change.text);
            }
        }
        self.index = LineIndex::new(&self.text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_columns_count_surrogate_pairs_twice() {
        // "é" is 2 bytes / 1 UTF-16 unit; "𝔼" is 4 bytes / 2 units.
        let d = Document::new("a = \"é𝔼x\"\nb".into(), 1);
        let x = d.text().find('x').unwrap();
        assert_eq!(d.lsp_position(x, Encoding::Utf16), Position::new(0, 8));
        assert_eq!(d.lsp_position(x, Encoding::Utf8), Position::new(0, 11));
        assert_eq!(d.offset(Position::new(0, 8), Encoding::Utf16), x);
        assert_eq!(d.offset(Position::new(0, 11), Encoding::Utf8), x);
        // Inside the surrogate pair: the character's start.
        let e = d.text().find('𝔼').unwrap();
        assert_eq!(d.offset(Position::new(0, 7), Encoding::Utf16), e);
        // Past the line's end: the line's end; past the last line: the text's end.
        assert_eq!(d.offset(Position::new(0, 99), Encoding::Utf16), x + 2);
        assert_eq!(
            d.offset(Position::new(7, 0), Encoding::Utf16),
            d.text().len()
        );
        assert_eq!(
            d.offset(Position::new(1, 1), Encoding::Utf16),
            d.text().len()
        );
    }

    #[test]
    fn incremental_changes_apply_in_order() {
        let mut d = Document::new("batch { micro = 16 }\n".into(), 1);
        let at = |l, c| Range::new(Position::new(l, c), Position::new(l, c));
        d.apply(
            TextDocumentContentChangeEvent {
                range: Some(at(0, 18)),
                range_length: None,
                text: ", accumulate = 2".into(),
            },
            Encoding::Utf16,
        );
        assert_eq!(d.text(), "batch { micro = 16, accumulate = 2 }\n");
        d.apply(
            TextDocumentContentChangeEvent {
                range: Some(Range::new(Position::new(0, 16), Position::new(0, 18))),
                range_length: None,
                text: "8".into(),
            },
            Encoding::Utf16,
        );
        assert_eq!(d.text(), "batch { micro = 8, accumulate = 2 }\n");
    }
}
