//! Exit codes beyond 0 and 1, and the confirmation every destructive command asks for.

use std::io::{BufRead, Write};

/// Exit code when accounting finds lost operations.
pub const EXIT_LOST: i32 = 2;
/// Exit code when the operator did not confirm.
pub const EXIT_ABORTED: i32 = 3;

pub(crate) fn confirm(yes: bool, what: &str, out: &mut (dyn Write + Send)) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    write!(out, "About to {what}. Type yes to continue: ")?;
    out.flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let ok = line.trim() == "yes";
    if !ok {
        writeln!(out, "aborted; nothing changed")?;
    }
    Ok(ok)
}
