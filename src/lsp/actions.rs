//! Quick fixes: the [`crate::diagnostics::Fix`]es the checker attached to its findings (a
//! did-you-mean key, `accumulate = 6` for a broken batch invariant, a renamed key…), offered
//! for the findings that touch the requested range, as workspace edits.

use std::collections::HashMap;

use lsp_types::{
    CodeAction, CodeActionKind, CodeActionOrCommand, CodeActionParams, TextEdit, Uri, WorkspaceEdit,
};

use super::document::Encoding;
use super::Open;
use crate::check::Analysis;

/// The quick fixes for the range of `params`.
pub fn code_actions(
    open: &Open,
    analysis: &Analysis,
    uri: &Uri,
    params: &CodeActionParams,
    enc: Encoding,
) -> Vec<CodeActionOrCommand> {
    if let Some(only) = &params.context.only {
        if !only.iter().any(|k| k.as_str().starts_with("quickfix")) {
            return Vec::new();
        }
    }
    let want = open.doc.span(params.range, enc);
    let mut out = Vec::new();
    for d in &analysis.checked.diagnostics {
        let s = d.primary.span;
        // Touching counts: a cursor at either end of the span asks about it.
        if s.end < want.start || want.end < s.start {
            continue;
        }
        let preferred = d.fixes.len() == 1;
        for fix in &d.fixes {
            let edits: Vec<TextEdit> = fix
                .edits
                .iter()
                .map(|e| TextEdit::new(open.doc.range(e.span, enc), e.text.clone()))
                .collect();
            out.push(CodeActionOrCommand::CodeAction(CodeAction {
                title: fix.title.clone(),
                kind: Some(CodeActionKind::QUICKFIX),
                diagnostics: Some(vec![super::diagnostics::to_lsp(
                    d, &open.doc, uri, enc, None,
                )]),
                edit: Some(WorkspaceEdit {
                    changes: Some(HashMap::from([(uri.clone(), edits)])),
                    ..Default::default()
                }),
                is_preferred: Some(preferred),
                ..Default::default()
            }));
        }
    }
    out
}
