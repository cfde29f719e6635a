//! The command line (`src/cli/`): bad input gets one clear line and loses
//! nothing: the error matrix of every failure an operator can cause
//! (`errors`, `cli_errors`), the second operator audit (`audit`), the
//! exit-code table of docs/operations.md run case by case (`exit_codes`),
//! and `exec` killed leaving nothing running (`lifeline`).

mod audit;
mod cli_errors;
mod errors;
mod exit_codes;
mod lifeline;
