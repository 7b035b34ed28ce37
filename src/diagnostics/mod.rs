//! Diagnostics: one message, a primary span, labelled secondary spans, a help line.
//!
//! Rendered for people with miette (graphical, like rustc) and for editors as JSON lines
//! (the contract is documented in docs/diagnostics-json.md).

pub mod codes;
pub mod source;

use std::fmt;

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceSpan};
use serde::Serialize;

use crate::diagnostics::source::SourceFile;
use crate::syntax::ast::Span;

/// How bad a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The recipe cannot be used as written.
    Error,
    /// Accepted, but probably not what was meant.
    Warning,
    /// Information the user should know.
    Note,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        })
    }
}

/// A span with a short text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// Where.
    pub span: Span,
    /// What about it (may be empty).
    pub text: String,
}

impl Label {
    /// A label.
    pub fn new(span: Span, text: impl Into<String>) -> Self {
        Label {
            span,
            text: text.into(),
        }
    }
}

/// One finding about a recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Stable code such as `R0011`; see [`crate::diagnostics::codes`].
    pub code: &'static str,
    /// Error, warning or note.
    pub severity: Severity,
    /// One sentence.
    pub message: String,
    /// The place the message is about.
    pub primary: Label,
    /// Other places involved.
    pub secondary: Vec<Label>,
    /// How to fix it.
    pub help: Option<String>,
    /// Concrete edits that carry out the help (an editor offers them as quick fixes).
    pub fixes: Vec<Fix>,
}

/// One way to fix a diagnostic: a title and the edits to the recipe's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fix {
    /// What it does, e.g. "replace with `accumulate = 6`".
    pub title: String,
    /// Non-overlapping edits, applied together.
    pub edits: Vec<Edit>,
}

/// Replace the text at `span` with `text` (an empty span inserts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Edit {
    /// What to replace.
    pub span: Span,
    /// The new text.
    pub text: String,
}

impl Diagnostic {
    /// An error at `span`.
    pub fn error(code: &'static str, message: impl Into<String>, span: Span) -> Self {
        Diagnostic {
            code,
            severity: Severity::Error,
            message: message.into(),
            primary: Label::new(span, ""),
            secondary: Vec::new(),
            help: None,
            fixes: Vec::new(),
        }
    }

    /// A warning at `span`.
    pub fn warning(code: &'static str, message: impl Into<String>, span: Span) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, message, span)
        }
    }

    /// Sets the primary label's text.
    pub fn with_label(mut self, text: impl Into<String>) -> Self {
        self.primary.text = text.into();
        self
    }

    /// Adds a secondary label.
    pub fn with_secondary(mut self, span: Span, text: impl Into<String>) -> Self {
        self.secondary.push(Label::new(span, text));
        self
    }

    /// Sets the help line.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds a fix that replaces the text at `span` with `text`.
    pub fn with_fix(
        mut self,
        title: impl Into<String>,
        span: Span,
        text: impl Into<String>,
    ) -> Self {
        self.fixes.push(Fix {
            title: title.into(),
            edits: vec![Edit {
                span,
                text: text.into(),
            }],
        });
        self
    }

    /// True for errors.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Puts diagnostics in source order (then by code), the order `recipe check` reports them in.
pub fn sort(diagnostics: &mut [Diagnostic]) {
    diagnostics.sort_by(|a, b| {
        (a.primary.span.start, a.primary.span.end, a.code).cmp(&(
            b.primary.span.start,
            b.primary.span.end,
            b.code,
        ))
    });
}

/// miette's view of a diagnostic together with its source.
struct Report<'a> {
    diagnostic: &'a Diagnostic,
    source: NamedSource<String>,
    /// Labels of the same finding in another file (a pair's other side).
    related: Vec<Related<'a>>,
}

/// Labels of a finding in a second file, drawn below the first as a note.
struct Related<'a> {
    labels: &'a [Label],
    source: NamedSource<String>,
    name: String,
}

impl fmt::Debug for Related<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl fmt::Display for Related<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in {}", self.name)
    }
}

impl std::error::Error for Related<'_> {}

impl miette::Diagnostic for Related<'_> {
    fn severity(&self) -> Option<miette::Severity> {
        Some(miette::Severity::Advice)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let text = |t: &str| (!t.is_empty()).then(|| t.to_string());
        Some(Box::new(self.labels.iter().map(move |l| {
            LabeledSpan::new_with_span(text(&l.text), source_span(l.span))
        })))
    }
}

impl fmt::Debug for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.diagnostic.fmt(f)
    }
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diagnostic.message)
    }
}

impl std::error::Error for Report<'_> {}

fn source_span(span: Span) -> SourceSpan {
    SourceSpan::new(span.start.into(), span.len())
}

impl miette::Diagnostic for Report<'_> {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.diagnostic.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diagnostic.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
            Severity::Note => miette::Severity::Advice,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diagnostic
            .help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&self.source)
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        if self.related.is_empty() {
            return None;
        }
        Some(Box::new(
            self.related.iter().map(|r| r as &dyn miette::Diagnostic),
        ))
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let d = self.diagnostic;
        let text = |t: &str| (!t.is_empty()).then(|| t.to_string());
        let primary =
            LabeledSpan::new_primary_with_span(text(&d.primary.text), source_span(d.primary.span));
        let secondary = d
            .secondary
            .iter()
            .map(move |l| LabeledSpan::new_with_span(text(&l.text), source_span(l.span)));
        Some(Box::new(std::iter::once(primary).chain(secondary)))
    }
}

/// How human output is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Unicode box drawing with colours (a terminal).
    Color,
    /// Unicode box drawing, no colours (pipes, files, snapshots).
    Plain,
}

/// Renders one diagnostic the way `recipe check` prints it.
pub fn render_human(diagnostic: &Diagnostic, file: &SourceFile, style: Style) -> String {
    render_human_with(diagnostic, file, None, style)
}

/// Renders a diagnostic whose finding also has labels in a second file (`other`), drawn below
/// the first file's snippet.
pub fn render_human_with(
    diagnostic: &Diagnostic,
    file: &SourceFile,
    other: Option<(&SourceFile, &[Label])>,
    style: Style,
) -> String {
    let theme = match style {
        Style::Color => GraphicalTheme::unicode(),
        Style::Plain => GraphicalTheme::unicode_nocolor(),
    };
    let handler = GraphicalReportHandler::new_themed(theme).with_width(100);
    let related = other
        .filter(|(_, labels)| !labels.is_empty())
        .map(|(f, labels)| Related {
            labels,
            source: NamedSource::new(f.name.clone(), f.text.clone()),
            name: f.name.clone(),
        })
        .into_iter()
        .collect();
    let report = Report {
        diagnostic,
        source: NamedSource::new(file.name.clone(), file.text.clone()),
        related,
    };
    let mut out = String::new();
    if handler.render_report(&mut out, &report).is_err() {
        // Rendering into a String cannot fail short of a miette bug; never lose the message.
        out = format!(
            "{}[{}]: {}\n",
            diagnostic.severity, diagnostic.code, diagnostic.message
        );
    }
    out
}

/// A position in the JSON output: 1-based line and column (in characters), and the byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct JsonPosition {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, counted in Unicode scalar values.
    pub column: usize,
    /// 0-based byte offset.
    pub offset: usize,
}

/// A span in the JSON output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct JsonSpan {
    /// First character.
    pub start: JsonPosition,
    /// One past the last character.
    pub end: JsonPosition,
}

/// A label in the JSON output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JsonLabel {
    /// Where.
    pub span: JsonSpan,
    /// The label text (may be empty).
    pub text: String,
    /// True for the primary label.
    pub primary: bool,
    /// The file of a label in another file than the diagnostic's (a pair's other side).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// One diagnostic as `recipe check --format json` prints it (one object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JsonDiagnostic {
    /// Stable code, e.g. `R0011`.
    pub code: String,
    /// `error`, `warning` or `note`.
    pub severity: Severity,
    /// One sentence.
    pub message: String,
    /// The file as given on the command line.
    pub file: String,
    /// The primary span.
    pub span: JsonSpan,
    /// All labels, the primary first.
    pub labels: Vec<JsonLabel>,
    /// How to fix it, if known.
    pub help: Option<String>,
    /// Edits that carry out the help (an editor's quick fixes); absent when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<JsonFix>,
}

/// A fix in the JSON output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JsonFix {
    /// What it does.
    pub title: String,
    /// The edits, applied together: each replaces its span's text with `text`.
    pub edits: Vec<JsonEdit>,
}

/// One edit of a fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JsonEdit {
    /// What to replace (empty: insert at `start`).
    pub span: JsonSpan,
    /// The new text.
    pub text: String,
}

/// Converts a diagnostic to its JSON form.
pub fn to_json(diagnostic: &Diagnostic, file: &SourceFile) -> JsonDiagnostic {
    let span = |s: Span| JsonSpan {
        start: position(file, s.start),
        end: position(file, s.end),
    };
    let mut labels = vec![JsonLabel {
        span: span(diagnostic.primary.span),
        text: diagnostic.primary.text.clone(),
        primary: true,
        file: None,
    }];
    labels.extend(diagnostic.secondary.iter().map(|l| JsonLabel {
        span: span(l.span),
        text: l.text.clone(),
        primary: false,
        file: None,
    }));
    JsonDiagnostic {
        code: diagnostic.code.to_string(),
        severity: diagnostic.severity,
        message: diagnostic.message.clone(),
        file: file.name.clone(),
        span: span(diagnostic.primary.span),
        labels,
        help: diagnostic.help.clone(),
        fixes: diagnostic
            .fixes
            .iter()
            .map(|f| JsonFix {
                title: f.title.clone(),
                edits: f
                    .edits
                    .iter()
                    .map(|e| JsonEdit {
                        span: span(e.span),
                        text: e.text.clone(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Converts a diagnostic with labels in a second file (`other`) to its JSON form: those labels
/// carry their `file`.
pub fn to_json_with(
    diagnostic: &Diagnostic,
    file: &SourceFile,
    other: Option<(&SourceFile, &[Label])>,
) -> JsonDiagnostic {
    let mut out = to_json(diagnostic, file);
    if let Some((f, labels)) = other {
        out.labels.extend(labels.iter().map(|l| JsonLabel {
            span: JsonSpan {
                start: position(f, l.span.start),
                end: position(f, l.span.end),
            },
            text: l.text.clone(),
            primary: false,
            file: Some(f.name.clone()),
        }));
    }
    out
}

fn position(file: &SourceFile, offset: usize) -> JsonPosition {
    let (line, column) = file.line_col(offset);
    JsonPosition {
        line,
        column,
        offset,
    }
}
