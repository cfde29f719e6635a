//! `run --compress zstd` (docs/design.md §16): once a rotated file is no
//! longer the newest rotated file, it is replaced by
//! `<task>.<stream>.<N>.zst`, zstd frames at level
//! [`LEVEL`](crate::shared::logfile::LEVEL) that the `zstd` tool reads.
//! The active file and the newest rotated file stay plain.
//!
//! Guarantees, and what proves them:
//! - **Off the capture path.** Compression runs on its own thread
//!   ([`Compressor`]), started with the daemon only under `--compress`:
//!   the capture thread only sends it the stream's new active index at
//!   each rotation (a channel send, never a wait). The thread blocks on
//!   that channel when there is nothing to compress: no timer, no wakeup
//!   while idle. A slow disk slows the thread, never the pumps
//!   (`benches/compress.sh` measures capture with and without).
//! - **Crash-safe replacement** ([`compress_file`]): the frames are
//!   written under the hidden temporary name `.<task>.<stream>.<N>.zst.tmp`
//!   (never a log file's name, so no reader opens a partial one),
//!   fsynced, renamed to `<task>.<stream>.<N>.zst`, the directory
//!   fsynced, and only then is the plain file removed. A kill -9 at any
//!   moment leaves the plain file, or the complete `.zst`, or both — and
//!   both count as one file N everywhere
//!   ([`crate::shared::layout::scan_any_in`]); the rotator's `tidy` at the
//!   next start (`daemon/rotate/tidy.rs`)
//!   removes the temporary name and, of both, the plain one. A file
//!   purged while it was being compressed takes its `.zst` with it.
//!   (`tests::*` below; `tests/it/daemon/compress.rs::kill_9_during_compression_keeps_every_line_once_and_no_stray_name`.)
//! - Every name is resolved through the log directory's [`Dir`]; only
//!   logmon's own plain files are compressed ([`Dir::open_own`]).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::daemon::rotate::{Kick, Rotator};
use crate::shared::dir::{Claim, Dir};
use crate::shared::layout::{file_name, parse_any, zst_name, zst_temp_name, Stream, TaskName};
use crate::shared::logfile::LEVEL;

/// How much of a plain file is read at a time; the stop flag is looked at
/// between pieces.
const PIECE: usize = 128 * 1024;

/// What [`compress_file`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Done {
    /// `<N>.zst` replaced the plain file.
    Compressed {
        /// Plain bytes read.
        plain: u64,
        /// Bytes of the `.zst` written.
        packed: u64,
    },
    /// Nothing to do: the plain file is gone (purged, or already
    /// compressed), or is not logmon's own.
    Skipped,
    /// Stopped before the rename: the temporary name was removed and the
    /// plain file is untouched.
    Stopped,
}

/// Replaces plain file `n` by `<N>.zst` (module docs): temporary name,
/// fsync, rename, directory fsync, then the plain name removed; if the
/// plain file was purged meanwhile, the `.zst` goes too. `stop` is looked
/// at between pieces.
pub fn compress_file(
    dir: &Dir,
    task: &TaskName,
    stream: Stream,
    n: u64,
    stop: &AtomicBool,
) -> io::Result<Done> {
    let plain_name = file_name(task, stream, n);
    let Ok(Some(mut plain)) = dir.open_own(&plain_name, OFlag::O_RDONLY)? else {
        return Ok(Done::Skipped);
    };
    let tmp = zst_temp_name(task, stream, n);
    let out = match dir.create_own(&tmp, OFlag::O_WRONLY, Mode::from_bits_truncate(0o644))? {
        Claim::Created { file, .. } => file,
        Claim::Occupied { by, .. } => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} is taken by a {by}", dir.display(&tmp).display()),
            ))
        }
    };
    let written = (|| {
        let mut enc = zstd::stream::write::Encoder::new(out, LEVEL)?;
        // The plain length in the frame header: listings read it
        // (`crate::shared::logfile::zst_plain_len`) without decompressing.
        enc.set_pledged_src_size(Some(plain.metadata()?.len()))?;
        let mut buf = vec![0u8; PIECE];
        let mut plain_bytes = 0u64;
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let got = plain.read(&mut buf)?;
            if got == 0 {
                break;
            }
            enc.write_all(&buf[..got])?;
            plain_bytes += got as u64;
        }
        let out = enc.finish()?;
        // The plain file's mtime, which readers take as the time of its
        // last line when its index is gone.
        out.set_modified(plain.metadata()?.modified()?)?;
        out.sync_all()?;
        Ok(Some((plain_bytes, out.metadata()?.len())))
    })();
    let (plain_bytes, packed) = match written {
        Ok(Some(sizes)) => sizes,
        Ok(None) => {
            dir.remove(&tmp)?;
            return Ok(Done::Stopped);
        }
        Err(e) => {
            let _ = dir.remove(&tmp);
            return Err(e);
        }
    };
    match publish(dir, task, stream, n) {
        Ok(true) => {}
        // Purged meanwhile (the temporary name with it): nothing stays.
        Ok(false) => return Ok(Done::Skipped),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Done::Skipped),
        Err(e) => return Err(e),
    }
    Ok(Done::Compressed {
        plain: plain_bytes,
        packed,
    })
}

/// The last steps of [`compress_file`], once the temporary name holds the
/// complete, synced frames: rename it to `<N>.zst`, make that durable,
/// then remove the plain name — or, if purge removed the plain file
/// meanwhile, the `.zst` too. Returns whether the `.zst` stays.
fn publish(dir: &Dir, task: &TaskName, stream: Stream, n: u64) -> io::Result<bool> {
    let plain_name = file_name(task, stream, n);
    let zst = zst_name(task, stream, n);
    dir.rename(zst_temp_name(task, stream, n), &zst)?;
    // The rename durable before the plain name goes: a crash can never
    // leave neither.
    dir.sync()?;
    if dir.stat(&plain_name)?.is_some() {
        dir.remove(&plain_name)?;
        Ok(true)
    } else {
        // Purged while compressing: what purge meant to remove goes.
        dir.remove(&zst)?;
        Ok(false)
    }
}

/// The plain files of `stream` to compress when `active` is its active
/// index: logmon's own plain files below the newest file under it.
fn due(dir: &Dir, task: &TaskName, stream: Stream, active: u64) -> io::Result<Vec<u64>> {
    let mut below: Vec<(u64, bool)> = dir
        .list()?
        .iter()
        .filter_map(|n| n.to_str().and_then(|s| parse_any(s, task, stream)))
        .filter(|&(n, _)| n < active)
        .collect();
    below.sort_unstable();
    let newest = below.last().map(|&(n, _)| n);
    Ok(below
        .into_iter()
        .filter(|&(n, z)| !z && Some(n) != newest)
        .map(|(n, _)| n)
        .collect())
}

/// The compression thread of one daemon (module docs).
#[derive(Debug)]
pub struct Compressor {
    tx: Option<Sender<(Stream, u64)>>,
    rx: Option<Receiver<(Stream, u64)>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// `--compress`: the compressor (its thread not started yet), with each
/// rotator given its [`Kick`]; `None` without a codec.
pub fn attach(
    codec: Option<crate::shared::config::Codec>,
    rotators: [&mut Rotator; 2],
) -> Option<Compressor> {
    codec?;
    let c = Compressor::new();
    if let Some(k) = c.kick() {
        for r in rotators {
            r.set_compressor(k.clone());
        }
    }
    Some(c)
}

/// Confines the daemon by `policy` (with the compressor's thread
/// allowed when there is one), then starts that thread: started after
/// confinement, it inherits every layer of it (docs/design.md §10).
pub fn confine_then_start(
    policy: crate::shared::sandbox::Policy<'_>,
    compressor: Option<&mut Compressor>,
    dir: &Arc<Dir>,
    task: &TaskName,
) -> crate::shared::sandbox::Status {
    match compressor {
        Some(c) => {
            let status = crate::shared::sandbox::confine(&policy.compressing());
            c.start(Arc::clone(dir), task.clone());
            status
        }
        None => crate::shared::sandbox::confine(&policy),
    }
}

impl Compressor {
    /// The channel, before the thread: the rotators take their
    /// [`Kick`]s (and queue their active index) while the daemon sets up;
    /// the thread is started by [`Compressor::start`] once the sandbox is
    /// in force, so that it is confined like the capture thread.
    pub fn new() -> Self {
        let (tx, rx) = channel();
        Compressor {
            tx: Some(tx),
            rx: Some(rx),
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    /// The handle the rotators take.
    pub fn kick(&self) -> Option<Kick> {
        self.tx.clone().map(Kick::new)
    }

    /// Starts the thread for `task` in `dir`: it compresses what each
    /// queued active index makes due (what an earlier logmon left
    /// first), then whatever [`Kick::rotated`] says. A thread that cannot
    /// be started leaves every file plain, and says so.
    pub fn start(&mut self, dir: Arc<Dir>, task: TaskName) {
        let Some(rx) = self.rx.take() else { return };
        let flag = Arc::clone(&self.stop);
        match std::thread::Builder::new()
            .name("logmon-zstd".into())
            .spawn(move || run(&dir, &task, &rx, &flag))
        {
            Ok(t) => self.thread = Some(t),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the compression thread; rotated files stay plain")
            }
        }
    }

    /// Stops the thread: a file being compressed is left plain (its
    /// temporary name removed) after at most one piece.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Default for Compressor {
    fn default() -> Self {
        Compressor::new()
    }
}

impl Drop for Compressor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread's loop: block for a rotation, take every one queued (the
/// highest active index per stream), compress what is due, repeat; end
/// when every sender is gone or `stop` is set.
fn run(dir: &Dir, task: &TaskName, rx: &Receiver<(Stream, u64)>, stop: &AtomicBool) {
    while let Ok(first) = rx.recv() {
        let mut todo = BTreeMap::new();
        for (s, a) in std::iter::once(first).chain(rx.try_iter()) {
            let e = todo.entry(s.as_str()).or_insert((s, a));
            e.1 = e.1.max(a);
        }
        for (stream, active) in todo.into_values() {
            let files = match due(dir, task, stream, active) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(%stream, error = %e, "cannot list files to compress");
                    continue;
                }
            };
            for n in files {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                match compress_file(dir, task, stream, n, stop) {
                    Ok(Done::Compressed { plain, packed }) => {
                        tracing::debug!(path = %dir.display(zst_name(task, stream, n)).display(),
                            plain, packed, "compressed")
                    }
                    Ok(Done::Skipped) => {}
                    Ok(Done::Stopped) => return,
                    Err(e) => tracing::warn!(
                        path = %dir.display(file_name(task, stream, n)).display(),
                        error = %e,
                        "cannot compress; the file stays plain"
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> TaskName {
        TaskName::new("web").unwrap()
    }

    fn names(d: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn lines(n: u32) -> Vec<u8> {
        (0..n)
            .flat_map(|i| format!("GET /item/{i} 200\n").into_bytes())
            .collect()
    }

    #[test]
    fn a_file_is_replaced_by_a_complete_zst_and_the_plain_name_goes() {
        let d = tempfile::tempdir().unwrap();
        let body = lines(20_000);
        std::fs::write(d.path().join("web.stdout.0"), &body).unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let done =
            compress_file(&dir, &task(), Stream::Stdout, 0, &AtomicBool::new(false)).unwrap();
        assert!(matches!(done, Done::Compressed { plain, .. } if plain == body.len() as u64));
        assert_eq!(names(d.path()), ["web.stdout.0.zst"]);
        let back = zstd::decode_all(&std::fs::read(d.path().join("web.stdout.0.zst")).unwrap()[..])
            .unwrap();
        assert_eq!(back, body);
    }

    #[test]
    fn a_stopped_compression_leaves_the_plain_file_and_no_temporary_name() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("web.stdout.0"), lines(100)).unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let done = compress_file(&dir, &task(), Stream::Stdout, 0, &AtomicBool::new(true)).unwrap();
        assert_eq!(done, Done::Stopped);
        assert_eq!(names(d.path()), ["web.stdout.0"]);
    }

    #[test]
    fn a_file_purged_while_compressed_takes_its_zst_along() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("web.stdout.0"), lines(10)).unwrap();
        let dir = Dir::open(d.path()).unwrap();
        // The frames written; purge removes the plain file before the
        // rename.
        std::fs::write(d.path().join(".web.stdout.0.zst.tmp"), b"frames").unwrap();
        std::fs::remove_file(d.path().join("web.stdout.0")).unwrap();
        assert!(!publish(&dir, &task(), Stream::Stdout, 0).unwrap());
        assert!(names(d.path()).is_empty());
        // Nothing left to compress once purged.
        assert_eq!(
            compress_file(&dir, &task(), Stream::Stdout, 0, &AtomicBool::new(false)).unwrap(),
            Done::Skipped
        );
    }

    #[test]
    fn only_files_below_the_newest_rotated_one_are_due() {
        let d = tempfile::tempdir().unwrap();
        for n in 0..5 {
            std::fs::write(d.path().join(format!("web.stdout.{n}")), b"l\n").unwrap();
        }
        std::fs::rename(
            d.path().join("web.stdout.1"),
            d.path().join("web.stdout.1.zst"),
        )
        .unwrap();
        let dir = Dir::open(d.path()).unwrap();
        assert_eq!(due(&dir, &task(), Stream::Stdout, 4).unwrap(), [0, 2]);
        assert_eq!(
            due(&dir, &task(), Stream::Stdout, 1).unwrap(),
            Vec::<u64>::new()
        );
    }
}
