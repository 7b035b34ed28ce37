//! The recipe's declared label set and the mapping of a row's raw label onto a class id.
//!
//! Real data writes labels either as names (`"spam"`) or as ids (`1`, or `"1"` in CSV where
//! every cell is text); SpamAssassin, for one, uses 0/1 while a recipe names them ham/spam. Both
//! are accepted as long as they land inside the declared set.

use super::DataError;

/// The labels a recipe declares, in id order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSet {
    id2label: Vec<String>,
    named: bool,
}

impl LabelSet {
    /// `n` unnamed classes with ids `0..n`, named `LABEL_0`, `LABEL_1`, … as HF `PretrainedConfig`
    /// does when no `id2label` is given.
    pub fn count(n: u32) -> Result<LabelSet, DataError> {
        if n == 0 {
            return Err(DataError::LabelDecl(
                "the number of labels must be at least 1".into(),
            ));
        }
        Ok(LabelSet {
            id2label: (0..n).map(|i| format!("LABEL_{i}")).collect(),
            named: false,
        })
    }

    /// Named classes; the i-th name has id `i`.
    pub fn names<I, S>(names: I) -> Result<LabelSet, DataError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let id2label: Vec<String> = names.into_iter().map(Into::into).collect();
        if id2label.is_empty() {
            return Err(DataError::LabelDecl("the label list is empty".into()));
        }
        for (i, name) in id2label.iter().enumerate() {
            if id2label[..i].contains(name) {
                return Err(DataError::LabelDecl(format!(
                    "label \"{name}\" is declared twice"
                )));
            }
        }
        if u32::try_from(id2label.len()).is_err() {
            return Err(DataError::LabelDecl("too many labels".into()));
        }
        Ok(LabelSet {
            id2label,
            named: true,
        })
    }

    /// The number of classes.
    pub fn len(&self) -> usize {
        self.id2label.len()
    }

    /// Always false: a `LabelSet` has at least one class.
    pub fn is_empty(&self) -> bool {
        self.id2label.is_empty()
    }

    /// Class names in id order (`LABEL_i` for a counted set): the model config's `id2label`.
    pub fn id2label(&self) -> &[String] {
        &self.id2label
    }

    /// Whether the recipe gave names (rather than a count).
    pub fn is_named(&self) -> bool {
        self.named
    }

    /// The id of an integer label, if it is in `0..len`.
    pub fn id_of_int(&self, value: i64) -> Option<u32> {
        u32::try_from(value)
            .ok()
            .filter(|&id| (id as usize) < self.id2label.len())
    }

    /// The id of a string label: a declared name, else the decimal text of an id in range.
    /// A name wins over an id so that names which look like numbers (`["1", "0"]`) keep
    /// their declared order. `LABEL_i` is not a name of a counted set: data written with
    /// those placeholder names is unusual, and accepting them would hide a mislabelled file.
    pub fn id_of_str(&self, value: &str) -> Option<u32> {
        if self.named {
            if let Some(i) = self.id2label.iter().position(|n| n == value) {
                return Some(i as u32);
            }
        }
        value.parse::<i64>().ok().and_then(|v| self.id_of_int(v))
    }

    /// The accepted values, for error messages: `"ham" or 0, "spam" or 1`, or
    /// `an id from 0 to 2`.
    pub fn allowed(&self) -> String {
        if self.named {
            let all: Vec<String> = self
                .id2label
                .iter()
                .enumerate()
                .map(|(i, n)| format!("\"{n}\" or {i}"))
                .collect();
            all.join(", ")
        } else {
            format!("an id from 0 to {}", self.id2label.len() - 1)
        }
    }
}
