//! placeholder
pub fn drive() {}
pub struct Backends;
pub struct RunTotals;
