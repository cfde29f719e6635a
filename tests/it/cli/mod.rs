//! The command line (`src/cli/`): bad input gets one clear line and loses
//! nothing, and the error matrix of every failure an operator can cause.

mod audit;
mod cli_errors;
mod errors;
mod exit_codes;
mod lifeline;
