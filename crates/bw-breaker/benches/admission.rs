//! Admission benchmark (filled in below).
fn main() {}
