//! The `logmon` binary: parses the command line and hands it to
//! [`logmon::cli`]. All logic lives in the library.

use clap::Parser;

fn main() {
    let cli = match logmon::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                std::process::exit(
                    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                        2
                    } else {
                        0
                    },
                );
            }
            // One line: what is wrong; --help has the rest.
            let text = e.render().to_string();
            let mut lines = text.lines();
            let first = lines
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            // Clap lists missing arguments on indented lines below the first.
            let more: Vec<&str> = lines
                .take_while(|l| l.starts_with("  "))
                .map(str::trim)
                .collect();
            let sep = if more.is_empty() { "" } else { " " };
            eprintln!(
                "logmon: error: {first}{sep}{} (see 'logmon --help')",
                more.join(", ")
            );
            std::process::exit(logmon::cli::EXIT_USAGE);
        }
    };
    let daemon = matches!(cli.command, logmon::cli::Command::Run(_));
    logmon::cli::init_tracing(if daemon { "info" } else { "warn" });
    std::process::exit(logmon::cli::dispatch(cli));
}
