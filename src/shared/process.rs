//! Process identity (docs/design.md §3, §5): a pid alone can be reused, so a
//! logmon is identified by its pid, the start time the kernel recorded for
//! it, and a random instance id it picked at start.
//!
//! Signalling goes through a pidfd, opened and then re-checked against the
//! start time, so a pid that was reused in between is never signalled.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Field 22 of `/proc/<pid>/stat`: the process's start time in clock ticks
/// since boot. `Ok(None)` when the process does not exist.
pub fn start_time(pid: u32) -> io::Result<Option<u64>> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => parse_stat(&s).map(|(_, t)| Some(t)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("cannot parse /proc/{pid}/stat"),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `pid` is alive (exists and is not a zombie) with `start`.
pub fn is_alive_with(pid: u32, start: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            matches!(parse_stat(&s), Some((state, t)) if t == start && state != 'Z' && state != 'X')
        }
        Err(_) => false,
    }
}

/// Parses the state (field 3) and start time (field 22) of a stat line. The
/// command name (field 2) may contain spaces and parentheses, so fields are
/// counted from the last `)`.
fn parse_stat(s: &str) -> Option<(char, u64)> {
    let rest = &s[s.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3), field 22 is the 19th further field.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// A fresh random 128-bit instance id, as 32 hex digits.
pub fn new_instance_id() -> io::Result<String> {
    let mut b = [0u8; 16];
    fill_random(&mut b).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Fills `buf` from the kernel's `getrandom(2)`, called through libc: the
/// `getrandom` crate looks glibc's function up with `dlsym`, which finds
/// nothing in a static binary, and falls back to opening `/dev/random`
/// and `/dev/urandom` — four more syscalls on every daemon's way to ready,
/// and a descriptor held for its whole life. The crate remains the
/// fallback where the syscall is missing or filtered.
fn fill_random(buf: &mut [u8]) -> Result<(), getrandom::Error> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe `rest`, which getrandom
        // writes at most `rest.len()` bytes into; no other effect.
        let n = unsafe { nix::libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(n) {
            Ok(n) => done += n,
            Err(_) if nix::errno::Errno::last() == nix::errno::Errno::EINTR => {}
            Err(_) => return getrandom::fill(rest),
        }
    }
    Ok(())
}

/// A pidfd for `pid`, verified to still have `start` (so it refers to the
/// process the state names, not one that reused its pid). `Ok(None)` when
/// that process is gone.
pub fn pidfd_checked(pid: u32, start: u64) -> io::Result<Option<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1;
    // no memory is passed.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as nix::libc::pid_t, 0) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(nix::libc::ESRCH) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // SAFETY: the syscall returned a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // Checked after opening: from now on the pidfd pins this very process.
    if is_alive_with(pid, start) {
        Ok(Some(fd))
    } else {
        Ok(None)
    }
}

/// Sends `sig` through a pidfd.
pub fn pidfd_signal(fd: &OwnedFd, sig: nix::sys::signal::Signal) -> io::Result<()> {
    // SAFETY: pidfd_send_signal(fd, sig, NULL info, 0 flags): no memory is
    // passed; the fd is owned and open.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig as nix::libc::c_int,
            std::ptr::null::<nix::libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(nix::libc::ESRCH) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// Waits until the process behind `fd` has exited (the pidfd turns
/// readable), at most `timeout`. Returns whether it exited.
pub fn pidfd_wait(fd: &OwnedFd, timeout: Duration) -> io::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let end = Instant::now() + timeout;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let ms = PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits until `pid` with `start` no longer runs (exited, even if not yet
/// reaped), at most `timeout`.
pub fn wait_gone(pid: u32, start: u64, timeout: Duration) -> io::Result<bool> {
    match pidfd_checked(pid, start)? {
        None => Ok(true),
        Some(fd) => pidfd_wait(&fd, timeout),
    }
}

/// Whether process `pid` holds a `flock` on the file `file` (its device
/// and inode): some descriptor in `/proc/<pid>/fd` names that file and
/// `/proc/<pid>/fdinfo/<fd>` lists a `FLOCK` on it. This is how an agent
/// proves a pid is *the* logmon of a task (it holds that task's lock)
/// before it signals it. `Ok(false)` when it cannot be proven, including
/// when the process is gone; an error when `/proc/<pid>/fd` cannot be read
/// (another user's process: only its owner or root may look).
pub fn holds_flock(pid: u32, file: crate::shared::dir::FileId) -> io::Result<bool> {
    let fds = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for fd in fds.flatten() {
        // stat follows the magic link to the open file itself.
        let Ok(st) = nix::sys::stat::stat(&fd.path()) else {
            continue;
        };
        if crate::shared::dir::FileId::of(&st) != file {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        if info
            .lines()
            .any(|l| l.starts_with("lock:") && l.contains("FLOCK") && l.contains("WRITE"))
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The real uid of process `pid` (`Uid:` in `/proc/<pid>/status`).
pub fn uid_of(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The command line of process `pid`, one entry per argument.
pub fn cmdline(pid: u32) -> Option<Vec<std::ffi::OsString>> {
    use std::os::unix::ffi::OsStrExt;
    let b = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        b.split(|c| *c == 0)
            .filter(|a| !a.is_empty())
            .map(|a| std::ffi::OsStr::from_bytes(a).to_owned())
            .collect(),
    )
}

/// The value of `flag` in a command line (`--flag VALUE` or
/// `--flag=VALUE`), the first one given.
pub fn flag_value(args: &[std::ffi::OsString], flag: &str) -> Option<std::ffi::OsString> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            return it.next().cloned();
        }
        let s = a.to_string_lossy();
        if let Some(v) = s.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            return Some(v.into());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_ids_are_fresh_128_bit_hex() {
        let (a, b) = (new_instance_id().unwrap(), new_instance_id().unwrap());
        for id in [&a, &b] {
            assert_eq!(id.len(), 32);
            assert!(id.bytes().all(|c| c.is_ascii_hexdigit()));
        }
        assert_ne!(a, b);
    }

    #[test]
    fn a_flags_value_is_found_in_both_spellings() {
        let args = |a: &[&str]| {
            a.iter()
                .map(Into::into)
                .collect::<Vec<std::ffi::OsString>>()
        };
        let v = |a: &[&str], f| flag_value(&args(a), f).map(|s| s.to_string_lossy().into_owned());
        assert_eq!(
            v(&["logmon", "run", "--task", "web"], "--task").as_deref(),
            Some("web")
        );
        assert_eq!(
            v(&["logmon", "run", "--task=w2"], "--task").as_deref(),
            Some("w2")
        );
        assert_eq!(v(&["logmon", "run", "--tasks=x"], "--task"), None);
        assert_eq!(v(&["logmon", "run", "--task"], "--task"), None);
    }

    #[test]
    fn stat_with_spaces_and_parens_in_the_name_parses() {
        let line = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some(('S', 987654)));
    }

    #[test]
    fn own_start_time_is_known_and_stable() {
        let me = std::process::id();
        let a = start_time(me).unwrap().unwrap();
        assert_eq!(start_time(me).unwrap(), Some(a));
        assert!(is_alive_with(me, a));
        assert!(!is_alive_with(me, a + 1));
    }

    #[test]
    fn instance_ids_are_128_bit_hex_and_differ() {
        let a = new_instance_id().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_instance_id().unwrap());
    }

    #[test]
    fn a_held_flock_is_seen_and_a_plain_open_is_not() {
        let d = std::env::temp_dir().join(format!("logmon-flock-{}", std::process::id()));
        let f = std::fs::File::create(&d).unwrap();
        let id = crate::shared::dir::FileId::of(&nix::sys::stat::fstat(&f).unwrap());
        let me = std::process::id();
        assert!(!holds_flock(me, id).unwrap());
        let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
        assert!(holds_flock(me, id).unwrap());
        drop(lock);
        let _ = std::fs::remove_file(&d);
    }
}
