//! The library side of the commands that are not the compile pipeline itself: `recipe explain`
//! ([`explain`]), `recipe fmt` ([`format`]), `recipe import` ([`import`]: a DeepSpeed config and
//! TrainingArguments back into a recipe, which then goes through the pipeline), and writing
//! their outputs without leaving a half-written file ([`atomic`]).

pub mod atomic;
pub mod explain;
pub mod format;
pub mod import;
