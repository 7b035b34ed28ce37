//! Syntax: the grammar (grammar/recipe.pest), the AST and the parser.

pub mod ast;
pub mod delimiters;
pub mod expected;
mod fast;
pub mod number;
pub mod parser;

pub use parser::parse;
