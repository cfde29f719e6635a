//! Task metadata (docs/design.md §11): `--meta KEY=VALUE` pairs an agent
//! attaches to a task (namespace, job, group, alloc id, node…), shown in
//! `status`, carried by `logs --format json` and by the shipper, and kept
//! by `ensure` across relaunches.
//!
//! Validated before anything is started ([`Meta::insert`]): keys are
//! 1–64 bytes of `[A-Za-z0-9_.-]` (so they can become header names such as
//! `Logmon-Meta-<key>` and subject tokens); values are UTF-8 without control
//! characters, at most 1 KiB; at most 32 pairs. On a command line
//! ([`Meta::from_args`]) a key given twice is refused naming it, and a pair
//! that is not UTF-8 is refused showing it (lossily) with the flag. Kept in the log directory
//! as `.<task>.logmon.meta` (JSON), written atomically by the daemon
//! through the directory handle. That file is for readers only: it sits in
//! a directory the task can write, so logmon never takes metadata *from*
//! it; the agent's copy lives in its state file.
//!
//! `run` publishes the file when it holds the task lock ([`publish_unsynced`]): it
//! always describes the running logmon (removed when it runs without
//! metadata). `ensure` keeps the metadata across relaunches through the
//! state file (`ReattachConfig::meta`): a relaunch without `--meta` gets
//! the state's metadata.
//!
//! Tests: the unit tests below; through the binary, `tests/it/daemon/control.rs`
//! (`status` shows it, the file and a planted symlink), `tests/it/agent/ensure.rs`
//! (kept across a kill -9 and a relaunch), `tests/it/cli/errors.rs` (validation
//! errors, exit 2, from `--meta` and from `LOGMON_META`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::shared::dir::{Claim, Dir};
use crate::shared::error::{ConfigError, EXPECTED_PAIR};
use crate::shared::layout::TaskName;

/// Most pairs per task.
pub const MAX_PAIRS: usize = 32;
/// Longest key, in bytes.
pub const MAX_KEY: usize = 64;
/// Longest value, in bytes.
pub const MAX_VALUE: usize = 1024;

/// `.<task>.logmon.meta`: the readers' copy of a task's metadata.
pub fn file_name(task: &TaskName) -> String {
    crate::shared::layout::name(task, crate::shared::layout::Kind::Meta)
}

/// A task's metadata: validated keys and values, in key order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    try_from = "BTreeMap<String, String>",
    into = "BTreeMap<String, String>"
)]
pub struct Meta(BTreeMap<String, String>);

impl Meta {
    /// No metadata.
    pub fn new() -> Meta {
        Meta::default()
    }

    /// Adds `key = value` after validating both; a repeated key keeps the
    /// last value.
    pub fn insert(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let bad = |why: &'static str| ConfigError::InvalidMeta {
            pair: format!("{key}={value}"),
            why,
        };
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(bad("the key must be 1 to 64 bytes"));
        }
        if !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(bad(
                "the key may hold only letters, digits, '_', '-' and '.'",
            ));
        }
        if value.len() > MAX_VALUE {
            return Err(bad("the value must be at most 1024 bytes"));
        }
        if value.chars().any(char::is_control) {
            return Err(bad("the value must not contain control characters"));
        }
        if !self.0.contains_key(key) && self.0.len() >= MAX_PAIRS {
            return Err(bad("at most 32 metadata pairs per task"));
        }
        self.0.insert(key.to_owned(), value.to_owned());
        Ok(())
    }

    /// Parses one `KEY=VALUE` argument into this set.
    pub fn insert_pair(&mut self, pair: &str) -> Result<(), ConfigError> {
        match pair.split_once('=') {
            Some((k, v)) => self.insert(k, v),
            None => Err(ConfigError::InvalidMeta {
                pair: pair.to_owned(),
                why: EXPECTED_PAIR,
            }),
        }
    }

    /// The pairs, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Whether there is no metadata.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs as a map (for JSON output).
    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    /// The metadata of a command line: the `--meta` pairs when any were
    /// given, else the pairs of [`ENV_VAR`] (`env`, its value), separated
    /// by `,` (empty pieces ignored). A value containing `,` can only be
    /// given with `--meta`. An error names the pair, and the variable when
    /// the pair came from it; a key given twice is refused (the last one
    /// does not silently win), and so is a pair that is not UTF-8.
    pub fn from_args(
        flags: &[std::ffi::OsString],
        env: Option<&std::ffi::OsStr>,
    ) -> Result<Meta, ConfigError> {
        let mut m = Meta::new();
        if !flags.is_empty() {
            for p in flags {
                let Some(p) = p.to_str() else {
                    return Err(ConfigError::MetaNotUtf8 {
                        pair: p.to_string_lossy().into_owned(),
                    });
                };
                m.insert_new_pair(p, "--meta")?;
            }
            return Ok(m);
        }
        let Some(env) = env else {
            return Ok(m);
        };
        let in_var = |pair: String, why| ConfigError::InvalidMetaVar {
            var: ENV_VAR,
            pair,
            why,
        };
        let Some(env) = env.to_str() else {
            return Err(in_var(
                env.to_string_lossy().into_owned(),
                "the value must be UTF-8",
            ));
        };
        for p in env.split(',').filter(|p| !p.is_empty()) {
            m.insert_new_pair(p, ENV_VAR).map_err(|e| match e {
                ConfigError::InvalidMeta { pair, why } => in_var(pair, why),
                other => other,
            })?;
        }
        Ok(m)
    }

    /// [`insert_pair`](Self::insert_pair), refusing a key already set
    /// (`given_in` names where the pairs came from).
    fn insert_new_pair(&mut self, pair: &str, given_in: &'static str) -> Result<(), ConfigError> {
        if let Some((key, _)) = pair.split_once('=') {
            if self.0.contains_key(key) {
                return Err(ConfigError::DuplicateMeta {
                    key: key.to_owned(),
                    given_in,
                });
            }
        }
        self.insert_pair(pair)
    }
}

/// The variable `--meta` is read from when no flag is given.
pub const ENV_VAR: &str = "LOGMON_META";

impl std::fmt::Display for Meta {
    /// `k=v, k2=v2`, or `none`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, (k, v)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{k}={v}")?;
        }
        Ok(())
    }
}

impl TryFrom<BTreeMap<String, String>> for Meta {
    type Error = ConfigError;
    fn try_from(map: BTreeMap<String, String>) -> Result<Meta, ConfigError> {
        let mut m = Meta::new();
        for (k, v) in &map {
            m.insert(k, v)?;
        }
        Ok(m)
    }
}

impl From<Meta> for BTreeMap<String, String> {
    fn from(m: Meta) -> Self {
        m.0
    }
}

/// Writes `meta` as the readers' copy of `task`'s metadata: a temp name
/// created `O_EXCL` (a planted name is removed, never followed), fsynced,
/// renamed over `.<task>.logmon.meta` within the directory.
pub fn store(dir: &Dir, task: &TaskName, meta: &Meta) -> std::io::Result<()> {
    write_and_rename(dir, task, meta, true).map(drop)
}

/// [`store`]'s steps; with `sync_first` false the data is not synced
/// before the rename, and the file is returned for the caller to sync.
fn write_and_rename(
    dir: &Dir,
    task: &TaskName,
    meta: &Meta,
    sync_first: bool,
) -> std::io::Result<std::fs::File> {
    use std::io::Write;
    let name = file_name(task);
    let tmp = format!("{name}.tmp.{}", std::process::id());
    let json = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
    let mut file = match dir.create_own(&tmp, OFlag::O_WRONLY, Mode::from_bits_truncate(0o644))? {
        Claim::Created { file, .. } => file,
        Claim::Occupied { by, .. } => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} is taken by a {by}", dir.display(&tmp).display()),
            ))
        }
    };
    let written = file
        .write_all(&json)
        .and_then(|()| if sync_first { file.sync_data() } else { Ok(()) })
        .and_then(|()| dir.rename(&tmp, &name));
    if written.is_err() {
        let _ = dir.remove(&tmp);
    }
    written.map(|()| file)
}

/// Makes `.<task>.logmon.meta` say what the running logmon's metadata is
/// (called by `run` once it holds the task lock): written with [`store`]
/// when there is metadata, removed when there is none (a copy left by an
/// earlier run would otherwise describe this one). Anything at the name
/// that is not logmon's own regular file (a symlink, a hard link, another
/// owner's file, an empty directory) is removed first, never followed or
/// written through; returns how many such names were removed.
///
/// It does not wait for the disk: the file is renamed into
/// place unsynced and returned, for the caller to `sync_data` once it
/// has something more urgent done (`run` does it right after its ready
/// line, as the sync cost a start 0.5 ms at the median and up to 15 ms
/// on a busy disk). What a crash can leave changes by nothing a reader
/// sees: the rename was never made durable (no directory sync), so a
/// crash could already leave the old file, the new one or none; now it
/// can also leave the new name with partial content, which [`load`]
/// refuses like a missing file.
pub fn publish_unsynced(
    dir: &Dir,
    task: &TaskName,
    meta: &Meta,
) -> std::io::Result<(u64, Option<std::fs::File>)> {
    let name = file_name(task);
    let mut foreign = 0;
    if let Some(st) = dir.stat(&name)? {
        if let Some(why) = crate::shared::dir::foreign_reason(&st) {
            dir.remove_any(&name)?;
            foreign += 1;
            tracing::warn!(path = %dir.display(&name).display(), found = %why,
                "the metadata file's name was taken by something logmon did not create; removed it (never followed or written)");
        }
    }
    if meta.is_empty() {
        dir.remove(&name)?;
        return Ok((foreign, None));
    }
    let file = write_and_rename(dir, task, meta, false)?;
    Ok((foreign, Some(file)))
}

/// Reads the readers' copy of `task`'s metadata: trusted only when it is
/// logmon's own file ([`crate::shared::dir::Trust`]: a regular one-link file of
/// root or the reader, in a directory no one else can rename names in — a task cannot forge one, nor rename another
/// task's there), read with a cap ([`Dir::read_small`]: a sparse or huge
/// file costs nothing). Anything else, a missing file or one that does not
/// validate is `None`.
pub fn load(dir: &Dir, task: &TaskName) -> Option<Meta> {
    /// A metadata file is at most 32 pairs of 64 + 1024 bytes, in JSON.
    const CAP: u64 = 64 * 1024;
    let trust = dir.trust().ok()?;
    if trust.renamable_by_others().is_some() {
        return None;
    }
    let (bytes, st) = dir.read_small(file_name(task), CAP).ok()??;
    if trust.foreign_file(&st).is_some() {
        return None;
    }
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_pairs_are_kept_in_key_order_and_the_last_value_wins() {
        let mut m = Meta::new();
        for p in ["job=web", "namespace=prod", "alloc_id=9f-3", "job=api"] {
            m.insert_pair(p).unwrap();
        }
        let pairs: Vec<_> = m.iter().collect();
        assert_eq!(
            pairs,
            vec![("alloc_id", "9f-3"), ("job", "api"), ("namespace", "prod")]
        );
        assert_eq!(m.insert_pair("empty="), Ok(()));
        assert_eq!(m.get("empty"), Some(""));
    }

    #[test]
    fn bad_pairs_are_named_errors() {
        let mut m = Meta::new();
        for bad in [
            "novalue",
            "=x",
            "a b=x",
            "a/b=x",
            "k=line\nbreak",
            "k=\u{1b}[31m",
        ] {
            let e = m.insert_pair(bad).unwrap_err();
            assert!(e.to_string().contains("metadata"), "{bad:?}: {e}");
        }
        assert!(m.insert_pair(&format!("k={}", "x".repeat(1025))).is_err());
        assert!(m.insert_pair(&format!("{}=v", "k".repeat(65))).is_err());
        for i in 0..MAX_PAIRS {
            m.insert_pair(&format!("k{i}=v")).unwrap();
        }
        assert!(m.insert_pair("one_more=v").is_err());
    }

    #[test]
    fn flags_win_over_the_variable_which_is_split_at_commas() {
        use std::ffi::{OsStr, OsString};
        let flags = vec![OsString::from("note=a,b")];
        let m = Meta::from_args(&flags, Some(OsStr::new("job=env"))).unwrap();
        assert_eq!(m.get("note"), Some("a,b"));
        assert_eq!(m.get("job"), None);
        let m = Meta::from_args(&[], Some(OsStr::new("job=env,,ns=prod,"))).unwrap();
        assert_eq!(m.iter().count(), 2);
        assert_eq!(Meta::from_args(&[], None).unwrap(), Meta::new());
        let e = Meta::from_args(&[], Some(OsStr::new("note=a,b"))).unwrap_err();
        assert!(
            matches!(e, ConfigError::InvalidMetaVar { var: ENV_VAR, .. }),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("\"b\" in LOGMON_META") && msg.contains("with --meta"),
            "{msg}"
        );
        let e = Meta::from_args(&["a b=x".into()], None).unwrap_err();
        assert!(matches!(e, ConfigError::InvalidMeta { .. }), "{e:?}");
    }

    #[test]
    fn a_key_given_twice_or_a_pair_not_utf8_is_refused_by_name() {
        use std::ffi::{OsStr, OsString};
        use std::os::unix::ffi::OsStringExt;
        let twice = [OsString::from("job=a"), OsString::from("job=b")];
        let e = Meta::from_args(&twice, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "metadata key \"job\" is given twice in --meta: give each key once"
        );
        let e = Meta::from_args(&[], Some(OsStr::new("job=a,ns=x,job=b"))).unwrap_err();
        assert!(e.to_string().contains("twice in LOGMON_META"), "{e}");
        let bad = OsString::from_vec(b"k=caf\xe9".to_vec());
        let e = Meta::from_args(&[bad], None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid --meta \"k=caf\u{FFFD}\": metadata must be UTF-8"
        );
    }

    #[test]
    fn publish_writes_or_removes_the_readers_copy() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let task = TaskName::new("web").unwrap();
        let mut m = Meta::new();
        m.insert("job", "web").unwrap();
        assert_eq!(publish_unsynced(&dir, &task, &m).unwrap().0, 0);
        assert_eq!(load(&dir, &task), Some(m));
        assert_eq!(publish_unsynced(&dir, &task, &Meta::new()).unwrap().0, 0);
        assert!(!d.path().join(file_name(&task)).exists());
        std::fs::create_dir(d.path().join(file_name(&task))).unwrap();
        assert_eq!(publish_unsynced(&dir, &task, &Meta::new()).unwrap().0, 1);
        assert!(!d.path().join(file_name(&task)).exists());
    }

    #[test]
    fn json_round_trip_validates() {
        let mut m = Meta::new();
        m.insert("job", "web").unwrap();
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(s, r#"{"job":"web"}"#);
        assert_eq!(serde_json::from_str::<Meta>(&s).unwrap(), m);
        assert!(serde_json::from_str::<Meta>(r#"{"a b":"x"}"#).is_err());
    }

    #[test]
    fn store_then_load_through_the_directory_handle() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let task = TaskName::new("web").unwrap();
        assert_eq!(load(&dir, &task), None);
        let mut m = Meta::new();
        m.insert("job", "web").unwrap();
        // A symlink planted at the name is replaced, never followed.
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join(file_name(&task))).unwrap();
        assert_eq!(load(&dir, &task), None);
        store(&dir, &task, &m).unwrap();
        assert_eq!(load(&dir, &task), Some(m));
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
    }
}
