//! Writes logmon's man pages and shell completions, made from its clap
//! definitions, into a directory; the Debian package's build
//! (`pkg/build-deb.sh`) runs it before cargo-deb, whose `assets` in
//! Cargo.toml pick the files up from there.
//!
//! ```sh
//! cargo run --example gen-docs -- OUT_DIR DATE
//! ```
//!
//! DATE (YYYY-MM-DD) goes into each page's header: the build script passes
//! the last commit's, so that a rebuild makes the same pages.
//!
//! - `OUT_DIR/man/`: `logmon.1` and one page per subcommand
//!   (`logmon-run.1`, …, `logmon-ship.1`, the shipper's own flags:
//!   [`documented_command`]);
//! - `OUT_DIR/completions/`: for `logmon` and `logmon-ship`, bash
//!   (`logmon`, `logmon-ship`), zsh (`_logmon`, `_logmon-ship`) and fish
//!   (`logmon.fish`, `logmon-ship.fish`): the names each shell looks up.
//!
//! A generator rather than a hidden subcommand: the binaries link neither
//! clap_mangen nor clap_complete.

use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), Some(date), None) = (args.next(), args.next(), args.next()) else {
        eprintln!("gen-docs: error: usage: gen-docs OUT_DIR YYYY-MM-DD");
        return ExitCode::from(2);
    };
    let Some(date) = date.to_str() else {
        eprintln!("gen-docs: error: the date is not UTF-8: {}", date.display());
        return ExitCode::from(2);
    };
    match generate(Path::new(&out), date) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen-docs: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes every page and completion file under `out`.
fn generate(out: &Path, date: &str) -> Result<(), String> {
    let man = out.join("man");
    let completions = out.join("completions");
    for d in [&man, &completions] {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let logmon = documented_command();
    let mut pages = logmon.clone().disable_help_subcommand(true);
    // Built once, from the top: each subcommand's page is then named
    // after its path (logmon-run.1), as `man` finds it.
    pages.build();
    let header = Header {
        date,
        source: &format!("logmon {}", env!("CARGO_PKG_VERSION")),
    };
    man_pages(pages, &header, &man)
        .map_err(|e| format!("cannot write the man pages into {}: {e}", man.display()))?;
    let ship = logmon::ship::cli::Args::command();
    for (mut cmd, bin) in [(logmon, "logmon"), (ship, "logmon-ship")] {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let written =
                clap_complete::generate_to(shell, &mut cmd, bin, &completions).map_err(|e| {
                    format!(
                        "cannot write the {shell} completion of {bin} into {}: {e}",
                        completions.display()
                    )
                })?;
            // bash-completion looks a command up by its own name.
            if shell == Shell::Bash {
                let named = completions.join(bin);
                std::fs::rename(&written, &named)
                    .map_err(|e| format!("cannot rename {}: {e}", written.display()))?;
            }
        }
    }
    Ok(())
}

/// What every page's header says besides its name. (All of it is set: an
/// empty date would shift the header's later fields.)
struct Header<'a> {
    date: &'a str,
    source: &'a str,
}

/// Writes the page of `cmd` and of each of its visible subcommands.
fn man_pages(cmd: clap::Command, header: &Header, dir: &Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub.clone(), header, dir)?;
    }
    clap_mangen::Man::new(cmd)
        .date(header.date)
        .source(header.source)
        .manual("logmon manual")
        .generate_to(dir)?;
    Ok(())
}

/// The `logmon` command tree as documented: [`logmon::cli::Cli`], with
/// `ship`'s pass-through arguments replaced by the flags of `logmon-ship`
/// itself ([`logmon::ship::cli::Args`]), so that `man logmon-ship` and
/// `logmon ship <TAB>` show the shipper's real flags. Made here, not in
/// the library: only this generator needs the two command lines together.
fn documented_command() -> clap::Command {
    logmon::cli::Cli::command()
        .mut_subcommand("ship", |_| logmon::ship::cli::Args::command().name("ship"))
}
