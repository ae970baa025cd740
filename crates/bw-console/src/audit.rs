//! The audit stream the console writes before and after each action: `bw_ops::audit`, shared with bwctl.

pub use bw_ops::audit::*;
