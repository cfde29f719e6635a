//! The `logmon-containerd` binary: logmon as containerd's logger, given
//! to containerd as `--log-uri binary:///usr/bin/logmon-containerd?--log-dir=DIR`
//! (see `logmon::cli::containerd_main` and docs/guide.md).

#![warn(clippy::too_many_lines)]

fn main() {
    logmon::cli::containerd_main()
}
