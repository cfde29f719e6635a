//! `run`'s flags read without clap, for the daemon's own binary,
//! `logmon-run` (it must not link the argument parser, whose
//! code and start-up allocations would be in every daemon's memory).
//!
//! [`parse`] is a sound subset of the clap parser of [`super::RunArgs`]:
//! when it returns a configuration, clap returns the same one; whatever it
//! is not sure of (help, version, an unknown or repeated flag, a value it
//! does not accept, an empty variable, `--`), it returns `None` and
//! `logmon-run` hands the command line back to `logmon run`, whose clap
//! parser serves it or says what is wrong, exactly as before. The fast path
//! covers what agents, `launch` and the systemd unit pass.
//!
//! Proven by `tests::agrees_with_clap` (a property test: random command
//! lines of valid and invalid flags and values, repeats and typos;
//! whenever this parser answers, clap gives the same configuration) and
//! `tests::what_launch_and_the_unit_pass_takes_the_fast_path`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::shared::config::{self, CaptureConfig, TaskName, WriteErrorPolicy};

/// Each flag that takes a value, with its variable.
const VALUED: [(&str, &str); 14] = [
    ("--task", "LOGMON_TASK"),
    ("--log-dir", "LOGMON_LOG_DIR"),
    ("--stdout-fifo", "LOGMON_STDOUT_FIFO"),
    ("--stderr-fifo", "LOGMON_STDERR_FIFO"),
    ("--max-files", "LOGMON_MAX_FILES"),
    ("--max-file-size", "LOGMON_MAX_FILE_SIZE"),
    ("--socket", "LOGMON_SOCKET"),
    ("--on-write-error", "LOGMON_ON_WRITE_ERROR"),
    ("--pipe-size", "LOGMON_PIPE_SIZE"),
    ("--keep-unshipped", "LOGMON_KEEP_UNSHIPPED"),
    ("--max-delay", "LOGMON_MAX_DELAY"),
    ("--rate-limit", "LOGMON_RATE_LIMIT"),
    ("--rate-burst", "LOGMON_RATE_BURST"),
    ("--compress", "LOGMON_COMPRESS"),
];
const NO_SANDBOX: (&str, &str) = ("--no-sandbox", "LOGMON_NO_SANDBOX");
const META: &str = "--meta";

/// The configuration `logmon run <args>` means, with `env` for the
/// environment; `None` when only clap can say (module docs).
pub fn parse(
    args: impl IntoIterator<Item = OsString>,
    env: impl Fn(&str) -> Option<OsString>,
) -> Option<CaptureConfig> {
    Given::scan(args)?.config(&env)
}

/// What a command line gives: each valued flag once, the `--meta` pairs,
/// and whether `--no-sandbox` is there.
struct Given {
    flags: Vec<(&'static str, OsString)>,
    meta: Vec<OsString>,
    no_sandbox: bool,
}

impl Given {
    /// Reads `args`; `None` for anything clap must judge.
    fn scan(args: impl IntoIterator<Item = OsString>) -> Option<Given> {
        let mut given = Given {
            flags: Vec::new(),
            meta: Vec::new(),
            no_sandbox: false,
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let bytes = arg.as_bytes();
            let (name, inline) = match bytes.iter().position(|&b| b == b'=') {
                Some(i) => (
                    &bytes[..i],
                    Some(OsStr::from_bytes(&bytes[i + 1..]).to_owned()),
                ),
                None => (bytes, None),
            };
            if name == NO_SANDBOX.0.as_bytes() {
                // A value or a repeat: clap's to judge.
                if inline.is_some() || given.no_sandbox {
                    return None;
                }
                given.no_sandbox = true;
                continue;
            }
            let flag = if name == META.as_bytes() {
                META
            } else {
                VALUED.iter().find(|(f, _)| f.as_bytes() == name)?.0
            };
            let value = match inline {
                Some(v) => v,
                None => {
                    let v = args.next()?;
                    // clap would take a following flag as a missing value.
                    if v.as_bytes().starts_with(b"-") {
                        return None;
                    }
                    v
                }
            };
            // clap refuses an empty value (`--socket=`, `--socket ""`).
            if value.is_empty() {
                return None;
            }
            if flag == META {
                given.meta.push(value);
            } else if given.flags.iter().any(|(f, _)| *f == flag) {
                return None;
            } else {
                given.flags.push((flag, value));
            }
        }
        Some(given)
    }

    /// The value of `flag`: given, else its variable; `None` for an empty
    /// variable (clap's to judge). A flag given wins over its variable.
    fn value(
        &self,
        flag: &str,
        env: &impl Fn(&str) -> Option<OsString>,
    ) -> Option<Option<OsString>> {
        if let Some((_, v)) = self.flags.iter().find(|(f, _)| *f == flag) {
            return Some(Some(v.clone()));
        }
        let var = VALUED.iter().find(|(f, _)| *f == flag).map(|(_, v)| *v)?;
        match env(var) {
            Some(v) if v.is_empty() => None,
            v => Some(v),
        }
    }

    /// [`Given::value`] as text (`None` if it is not UTF-8).
    fn text(&self, flag: &str, env: &impl Fn(&str) -> Option<OsString>) -> Option<Option<String>> {
        match self.value(flag, env)? {
            Some(v) => Some(Some(v.into_string().ok()?)),
            None => Some(None),
        }
    }

    /// A size flag: plain bytes, or a number and a unit (what
    /// `config::parse_size` reads for clap too), else `default`.
    fn size(
        &self,
        flag: &str,
        default: u64,
        env: &impl Fn(&str) -> Option<OsString>,
    ) -> Option<u64> {
        match self.text(flag, env)? {
            Some(s) => config::parse_size(&s).ok(),
            None => Some(default),
        }
    }

    /// `--no-sandbox`, or its variable's boolean.
    fn no_sandbox(&self, env: &impl Fn(&str) -> Option<OsString>) -> Option<bool> {
        Some(
            self.no_sandbox
                || match env(NO_SANDBOX.1) {
                    None => false,
                    Some(v) => match v.to_str()? {
                        "1" | "true" | "yes" | "on" => true,
                        "0" | "false" | "no" | "off" => false,
                        _ => return None,
                    },
                },
        )
    }

    /// The configuration these flags and `env` make, validated.
    fn config(&self, env: &impl Fn(&str) -> Option<OsString>) -> Option<CaptureConfig> {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let task = TaskName::new(&self.text("--task", env)??).ok()?;
        let log_dir = PathBuf::from(self.value("--log-dir", env)??);
        let mut cfg = CaptureConfig::new(task, log_dir);
        if let Some(p) = self.value("--stdout-fifo", env)? {
            cfg.stdout_fifo = p.into();
        }
        if let Some(p) = self.value("--stderr-fifo", env)? {
            cfg.stderr_fifo = p.into();
        }
        if let Some(p) = self.value("--socket", env)? {
            cfg.socket = p.into();
        }
        cfg.max_files = match self.text("--max-files", env)? {
            Some(s) if digits(&s) => s.parse().ok()?,
            Some(_) => return None,
            None => config::DEFAULT_MAX_FILES,
        };
        cfg.max_file_size = self.size("--max-file-size", config::DEFAULT_MAX_FILE_SIZE, env)?;
        cfg.pipe_size = self.size("--pipe-size", config::DEFAULT_PIPE_SIZE, env)?;
        cfg.keep_unshipped = self.size("--keep-unshipped", 0, env)?;
        cfg.rate_limit = match self.text("--rate-limit", env)? {
            Some(s) => Some(config::parse_rate(&s).ok()?),
            None => None,
        };
        cfg.rate_burst = match self.text("--rate-burst", env)? {
            Some(_) => Some(self.size("--rate-burst", 0, env)?),
            None => None,
        };
        cfg.max_delay = match self.text("--max-delay", env)? {
            Some(s) => config::parse_delay(&s).ok()?,
            None => config::DEFAULT_MAX_DELAY,
        };
        cfg.on_write_error = match self.text("--on-write-error", env)?.as_deref() {
            None | Some("drop") => WriteErrorPolicy::Drop,
            Some("block") => WriteErrorPolicy::Block,
            Some(_) => return None,
        };
        cfg.compress = match self.text("--compress", env)?.as_deref() {
            None => None,
            Some("zstd") => Some(config::Codec::Zstd),
            Some(_) => return None,
        };
        cfg.no_sandbox = self.no_sandbox(env)?;
        cfg.meta = crate::shared::meta::Meta::from_args(
            &self.meta,
            env(crate::shared::meta::ENV_VAR).as_deref(),
        )
        .ok()?;
        cfg.validate().ok()?;
        Some(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use proptest::prelude::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    /// clap's answer, with no variable set (the unit tests' environment has
    /// none of logmon's).
    fn by_clap(args: &[OsString]) -> Option<CaptureConfig> {
        let mut argv = vec![OsString::from("logmon"), OsString::from("run")];
        argv.extend(args.iter().cloned());
        match super::super::Cli::try_parse_from(argv).ok()?.command {
            super::super::Command::Run(a) => a.to_config().ok(),
            _ => None,
        }
    }

    #[test]
    fn what_launch_and_the_unit_pass_takes_the_fast_path() {
        let mut cfg = CaptureConfig::new(TaskName::new("web").expect("task"), "/l");
        cfg.max_files = 3;
        cfg.max_file_size = 4096;
        cfg.keep_unshipped = 1 << 20;
        cfg.max_delay = std::time::Duration::from_millis(7);
        cfg.no_sandbox = true;
        cfg.rate_limit = Some(1 << 20);
        cfg.rate_burst = Some(8192);
        cfg.compress = Some(config::Codec::Zstd);
        cfg.meta.insert_pair("job=web").expect("meta");
        let args = crate::agent::launch::run_args(&cfg);
        assert_eq!(args[0], "run");
        assert_eq!(parse(args[1..].to_vec(), |_| None), Some(cfg));
        // systemd/logmon@.service: variables and --flag=value forms.
        let unit = os(&[
            "--task=api",
            "--max-file-size=10MiB",
            "--pipe-size",
            "1MiB",
            "--max-delay=0",
        ]);
        let env = |k: &str| (k == "LOGMON_LOG_DIR").then(|| OsString::from("/var/log/t"));
        let got = parse(unit, env).expect("fast path");
        assert_eq!(got.task.as_str(), "api");
        assert_eq!(got.log_dir, PathBuf::from("/var/log/t"));
        assert_eq!(got.max_file_size, 10 << 20);
        assert_eq!(got.pipe_size, 1 << 20);
        assert_eq!(got.max_delay, std::time::Duration::ZERO);
    }

    #[test]
    fn whatever_it_is_not_sure_of_goes_to_clap() {
        let base = ["--task", "t", "--log-dir", "/l"];
        for extra in [
            &["--help"][..],
            &["-h"],
            &["--version"],
            &["--task", "u"],
            &["--no-sandbox", "--no-sandbox"],
            &["--max-files", "+3"],
            &["--max-files", "0"],
            &["--on-write-error", "Drop"],
            &["--socket"],
            &["--socket", "--no-sandbox"],
            &["--"],
            &["--stdout-fifo="],
            &["--socket", ""],
            &["--tsak", "t"],
            &["--meta", "not a pair"],
        ] {
            let mut a = os(&base);
            a.extend(os(extra));
            assert_eq!(parse(a, |_| None), None, "{extra:?}");
        }
        assert_eq!(
            parse(os(&base), |k| (k == "LOGMON_SOCKET").then(OsString::new)),
            None
        );
        assert_eq!(parse(os(&["--log-dir", "/l"]), |_| None), None, "no task");
    }

    fn arg() -> impl Strategy<Value = Vec<String>> {
        let value = prop_oneof![
            Just("t".to_string()),
            Just("a/b".to_string()),
            Just("/l".to_string()),
            Just("0".to_string()),
            Just("7".to_string()),
            Just("+7".to_string()),
            Just("10MiB".to_string()),
            Just("1 KiB".to_string()),
            Just("-1".to_string()),
            Just("drop".to_string()),
            Just("block".to_string()),
            Just("k=v".to_string()),
            Just("k=w".to_string()),
            Just("50ms".to_string()),
            Just("2s".to_string()),
            Just("61s".to_string()),
            Just("99999999999GiB".to_string()),
            Just("1MiB/s".to_string()),
            Just("-1KiB/s".to_string()),
            Just("4096".to_string()),
            Just(String::new()),
        ];
        let flag = prop_oneof![
            Just("--task"),
            Just("--log-dir"),
            Just("--stdout-fifo"),
            Just("--stderr-fifo"),
            Just("--max-files"),
            Just("--max-file-size"),
            Just("--socket"),
            Just("--on-write-error"),
            Just("--pipe-size"),
            Just("--keep-unshipped"),
            Just("--meta"),
            Just("--max-delay"),
            Just("--no-sandbox"),
            Just("--rate-limit"),
            Just("--rate-burst"),
            Just("--tsak"),
        ];
        (flag, value, 0..3u8).prop_map(|(f, v, form)| match (f, form) {
            ("--no-sandbox", 0) => vec![f.to_string()],
            (_, 0) => vec![format!("{f}={v}")],
            (_, 1) => vec![f.to_string(), v],
            _ => vec![f.to_string()],
        })
    }

    proptest! {
        #[test]
        fn agrees_with_clap(
            args in proptest::collection::vec(arg(), 0..8),
            with_required in any::<bool>(),
        ) {
            let mut a: Vec<OsString> = Vec::new();
            if with_required {
                a.extend(os(&["--task", "t", "--log-dir", "/l"]));
            }
            a.extend(args.into_iter().flatten().map(OsString::from));
            if let Some(cfg) = parse(a.clone(), |_| None) {
                prop_assert_eq!(Some(cfg), by_clap(&a), "{:?}", a);
            }
        }
    }
}
