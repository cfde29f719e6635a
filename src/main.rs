//! The `logmon` binary: everything, argument parsing included, lives in
//! [`logmon::cli`], so an agent embedding the library can serve the `run`
//! subcommand from its own executable the same way.

#![warn(clippy::too_many_lines)]

fn main() {
    logmon::cli::main()
}
