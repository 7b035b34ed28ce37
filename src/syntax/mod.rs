//! Syntax: the grammar (grammar/recipe.pest), the AST and the parser.

pub mod ast;
pub mod delimiters;
pub mod edit;
pub mod expected;
pub mod number;
pub mod parser;
#[cfg(test)]
mod tests;

pub use parser::parse;
