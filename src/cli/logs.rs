//! `logmon logs`: print (and follow) a task's stream across its rotated files.

use super::{CliError, CliResult, LogsArgs, EXIT_FAILURE};

/// `logmon logs`.
pub fn run(_a: &LogsArgs) -> CliResult {
    Err(CliError::new(EXIT_FAILURE, "logs: not built yet"))
}
