//! The hisparse command.
fn main() {}
