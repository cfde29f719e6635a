//! Self-confinement (docs/design.md §10): once `run` is set up, and before
//! `logs` reads anything, logmon takes away from itself everything it does
//! not need, so that a bug a hostile task finds in it cannot become a host
//! compromise.
//!
//! [`confine`] applies, in this order:
//! 1. `PR_SET_NO_NEW_PRIVS`: nothing logmon could still execute gains
//!    privileges (and Landlock and seccomp require it without
//!    `CAP_SYS_ADMIN`);
//! 2. every capability dropped: bounding set first (that needs
//!    `CAP_SETPCAP`, which is dropped last), the ambient set cleared, then
//!    effective, permitted and inheritable emptied. logmon keeps its uid:
//!    root still owns what it created, so its own files stay writable
//!    without `CAP_DAC_OVERRIDE`;
//! 3. a Landlock ruleset, best effort across ABI versions (an older kernel
//!    enforces what it knows, and `status` says `partial (ABI N)`).
//!    Handled: every filesystem right of ABI 7, TCP bind and connect (ABI
//!    4), and the signal and abstract-unix-socket scopes (ABI 6). The
//!    rights are pinned to ABI 7, the newest this was tested on (the
//!    `landlock` crate's own advice): ABI 9's `RESOLVE_UNIX` would also
//!    need rules for the journald and `NOTIFY_SOCKET` paths. Allowed:
//!    - in the log directory (`run`; the rule is built from the directory
//!      descriptor opened at start, never from the path, which the task may
//!      have swapped for a symlink by now): read directory (resume, purge
//!      scans, `Dir::list`), read file (a resumed file's last byte), write
//!      file (capture, the lost-bytes marker), truncate (trimming a
//!      preallocation, the lock's pid), create regular files (the next log
//!      file, a vanished active file recreated, Reopen), remove files
//!      (purge, a planted name removed by `Dir::create_own`), remove
//!      directories (an empty directory planted at one of our names), and
//!      so rename within it (the create and remove rights of one directory:
//!      a purged file's index renamed to the next file's,
//!      [`crate::shared::index::IndexWriter::recycle`]). Not allowed: FIFOs, sockets
//!      and symlinks (all made before confinement), renaming or linking
//!      into another directory (`Refer`), device ioctls;
//!    - nothing beneath the log directory's parent, nor any other
//!      parent: the perimeter is logmon's own directories themselves.
//!      A rule on the parent would be the only way
//!      to write into a deleted log directory recreated at the same path
//!      (Landlock rules attach to inodes, and the new directory is a new
//!      inode), but it would open the parent's whole tree: with
//!      `--log-dir /var/log/myapp`, all of `/var/log`, where code injected
//!      into logmon could read a root 0600 file, or create, truncate,
//!      rename and remove files beside the log directory
//!      (`tests/sandbox.rs::injected_syscalls_cannot_leave_the_log_directory`
//!      makes the running daemon try, through ptrace). The trade-off: a
//!      confined logmon does not recreate a deleted log directory (the
//!      daemon tells its rotators whether it confines itself when it opens
//!      them). Its bytes wait per the write-error policy (`drop`
//!      counts them as dropped, `block` leaves them in the pipe and the
//!      task blocks), `status` says `log_dir_gone`, its log says so once,
//!      and the next logmon (`ensure`, or the unit's restart, once the
//!      directory exists again) takes over
//!      (`tests/it/daemon/faults.rs::deleted_log_dir_under_the_sandbox_*`);
//!      with `--no-sandbox` it is recreated in place through the parent's
//!      descriptor, as before
//!      (`tests/it/daemon/faults.rs::deleted_log_dir_is_recreated_without_the_sandbox_and_capture_goes_on`);
//!    - the FIFOs' directories: nothing. The FIFOs are opened (or made)
//!      before confinement and only their descriptors are used after;
//!    - in the socket's directory when logmon bound the socket there and
//!      it is not the log directory (its descriptor opened at start, never
//!      the path): remove a file (the socket is unlinked at stop);
//!    - `/dev/null`: write (capture discards peeked copies into it and the
//!      ready line replaces stdout with it);
//!    - `logs`: read directory and read file in the log directory, nothing
//!      else; with `--cursor FILE`, also read, create, write, truncate and
//!      remove files in FILE's directory (by the descriptor opened before
//!      confining), and the `rename` system calls
//!      ([`Profile::LogsCursor`]), for the temporary file renamed over the
//!      cursor.
//!
//!    Connecting to a *path* unix socket needs no Landlock right before ABI
//!    9, so `sd_notify` and journald keep working. Abstract unix sockets are
//!    scoped, except when `NOTIFY_SOCKET` names an abstract socket
//!    (`@…`): scoping would then cut `READY=1`, `STATUS=` and the fd store;
//! 4. a seccomp filter (allow-list, default action `ENOSYS`, never a kill,
//!    installed with `TSYNC` so it covers every thread): a call logmon does
//!    not make fails with "Function not implemented", which shows in its
//!    log and in a test, while capture goes on. `ENOSYS` rather than `EPERM`
//!    because it is what a library sees on an older kernel and falls back
//!    from (`clone3` → `clone`, `statx` → `fstatat`). Arguments are checked
//!    where it matters: `socket` only for `AF_UNIX` (no TCP or UDP, even
//!    on a kernel without Landlock ABI 4), `ioctl` only for the handful of
//!    requests logmon and its runtime make (no `TIOCSTI` into an operator's
//!    terminal from `logs`), `tgkill` only to itself (`abort`); `logs` may
//!    start threads (`clone` with `CLONE_THREAD`; the `notify` watcher)
//!    but `run` may not start anything (under `--compress`, one thread:
//!    the compressor, started once confined, [`Profile::RunCompress`]). No `execve`, `ptrace`, `mount`,
//!    `bind`, `listen`, `kill`, `setuid`… (the full list is [`syscalls`]).
//!
//! Seccomp: `seccompiler` (rust-vmm, Firecracker's and Cloud
//! Hypervisor's filter library: pure Rust, no libseccomp C library to link
//! into a static binary) gives the target (x86_64, aarch64, riscv64;
//! elsewhere seccomp reports `unsupported`) and installs the filter;
//! [`build_filter`] compiles it itself, as a binary search on the syscall
//! number, because seccompiler's linear chain made the kernel's
//! preparation of the filter a quarter of a millisecond of every start
//! (the decisions are checked equal to seccompiler's for every number and
//! argument tried). A call made with a foreign architecture's ABI (i386
//! `int 0x80`) is killed by its architecture check: logmon never makes one.
//!
//! Threads: Landlock, `no_new_privs` and capabilities are per thread and
//! inherited by threads created later. `run` confines itself on its only
//! thread (its event loop, `reactor`, is that thread; stop signals and
//! SIGIO come from a signalfd: `signals`); `logs` confines itself
//! before its runtime and the `notify` thread exist. [`confine`] installs
//! seccomp with `TSYNC` all the same, and warns when called with more than
//! one thread. (Landlock's `TSYNC`, ABI 8, is not requested: on an ABI 7
//! kernel asking for it turns the status into "partial".)
//!
//! `--no-sandbox` / `LOGMON_NO_SANDBOX=1` ([`set_disabled`]) skips all of
//! it, for debugging; `status` then says `off (--no-sandbox)`.
//!
//! Tests: `tests/sandbox.rs` — a running logmon's `/proc/<pid>/task/*/status`
//! (`NoNewPrivs: 1`, `Seccomp: 2`, no capabilities) and its `status` JSON;
//! `--no-sandbox`; every thread of `logs -f`; a child confined by
//! [`confine`] that can do every file operation logmon needs in its
//! directory and nothing outside it, no TCP, no exec, and survives an
//! unknown syscall; and the rarely taken paths of a confined daemon (disk
//! full under both policies, vanished file, Reopen, rotation and purge,
//! SIGTERM drain) losing no line. The unit tests below check the filter
//! compiles for this target, decides like seccompiler's own compilation of
//! the same rules, and the status strings.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, LandlockStatus, PathBeneath,
    PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use nix::libc;
use serde::{Deserialize, Serialize};

use crate::shared::dir::Dir;

/// What is in force, as `status` reports it (`"sandbox": {…}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// `PR_SET_NO_NEW_PRIVS` is set.
    pub no_new_privs: bool,
    /// `"none"` when every set is empty, else what is left and why.
    pub capabilities: String,
    /// `"ABI 7, enforced"`, `"partial (ABI N)"`, `"unsupported"`, or why not.
    pub landlock: String,
    /// `"filter"` when the seccomp filter is installed, else why not.
    pub seccomp: String,
}

/// What `status` says with `--no-sandbox`.
pub const OFF: &str = "off (--no-sandbox)";

impl Status {
    /// The status of a process that did not confine itself.
    pub fn off() -> Status {
        Status {
            no_new_privs: false,
            capabilities: OFF.into(),
            landlock: OFF.into(),
            seccomp: OFF.into(),
        }
    }

    /// Whether every layer is fully in force.
    pub fn is_full(&self) -> bool {
        self.no_new_privs
            && self.capabilities == "none"
            && self.landlock.ends_with(", enforced")
            && self.seccomp == "filter"
    }
}

impl Default for Status {
    fn default() -> Self {
        Status {
            no_new_privs: false,
            capabilities: "not confined".into(),
            landlock: "not confined".into(),
            seccomp: "not confined".into(),
        }
    }
}

/// `--no-sandbox`, set once by the command line before anything confines.
static DISABLED: AtomicBool = AtomicBool::new(false);

/// Turns confinement off for this process (`--no-sandbox`).
pub fn set_disabled(disabled: bool) {
    DISABLED.store(disabled, Ordering::Relaxed);
}

/// Whether confinement was turned off for this process (`--no-sandbox`).
pub fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

/// Which system calls the process keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The capture daemon: no new threads or processes.
    Run,
    /// The capture daemon with `--compress`: [`Profile::Run`] and one
    /// thread (the compressor, started after confinement).
    RunCompress,
    /// The reader: threads (the inotify watcher), inotify.
    Logs,
    /// The reader saving a cursor: [`Profile::Logs`] and renames.
    LogsCursor,
}

/// What a rule grants beneath a directory (or on a file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Everything the capture needs in the log directory (module docs).
    LogDir,
    /// Read the directory and its files.
    ReadOnly,
    /// Remove files (the socket's directory).
    RemoveFiles,
    /// Write an existing file (`/dev/null`).
    WriteFile,
    /// Read, create, write and replace files (the cursor's directory).
    Cursor,
}

impl Grant {
    fn access(self) -> BitFlags<AccessFs> {
        match self {
            Grant::LogDir => {
                AccessFs::ReadDir
                    | AccessFs::ReadFile
                    | AccessFs::WriteFile
                    | AccessFs::Truncate
                    | AccessFs::MakeReg
                    | AccessFs::RemoveFile
                    | AccessFs::RemoveDir
            }
            Grant::ReadOnly => AccessFs::ReadDir | AccessFs::ReadFile,
            Grant::RemoveFiles => AccessFs::RemoveFile.into(),
            Grant::WriteFile => AccessFs::WriteFile.into(),
            Grant::Cursor => {
                AccessFs::ReadFile
                    | AccessFs::WriteFile
                    | AccessFs::Truncate
                    | AccessFs::MakeReg
                    | AccessFs::RemoveFile
            }
        }
    }
}

/// Where a rule applies.
#[derive(Debug)]
enum Target<'a> {
    /// A descriptor opened earlier (never re-resolved).
    Fd(BorrowedFd<'a>),
    /// A trusted path, opened `O_PATH` when confining.
    Path(PathBuf),
}

/// What the process may still do once confined.
#[derive(Debug)]
pub struct Policy<'a> {
    profile: Profile,
    rules: Vec<(Target<'a>, Grant)>,
}

impl<'a> Policy<'a> {
    /// A policy allowing nothing on the filesystem.
    pub fn new(profile: Profile) -> Policy<'a> {
        Policy {
            profile,
            rules: Vec::new(),
        }
    }

    /// Grants `grant` beneath the directory (or on the file) open as `fd`.
    pub fn fd(mut self, fd: BorrowedFd<'a>, grant: Grant) -> Self {
        self.rules.push((Target::Fd(fd), grant));
        self
    }

    /// Grants `grant` beneath `path` (resolved when confining; use only for
    /// paths the task cannot swap).
    pub fn path(mut self, path: impl Into<PathBuf>, grant: Grant) -> Self {
        self.rules.push((Target::Path(path.into()), grant));
        self
    }

    /// `run`'s policy: the log directory itself (never its parent), the
    /// directory of the socket logmon bound when elsewhere (to unlink the
    /// socket at stop), both by the descriptors opened at start (the task
    /// may have swapped their paths for symlinks since), and `/dev/null`.
    pub fn run(log_dir: &'a Dir, socket_dir: Option<&'a Dir>) -> Self {
        let mut p = Policy::new(Profile::Run)
            .fd(log_dir.fd(), Grant::LogDir)
            .path("/dev/null", Grant::WriteFile);
        if let Some(dir) = socket_dir.filter(|d| d.id() != log_dir.id()) {
            p = p.fd(dir.fd(), Grant::RemoveFiles);
        }
        p
    }

    /// `run --compress`: [`Policy::run`], and the compression thread may
    /// be started (`clone` of a thread only, and what a new thread calls).
    pub fn compressing(mut self) -> Self {
        self.profile = Profile::RunCompress;
        self
    }

    /// `logs`' policy: read the log directory (the one open as `log_dir`,
    /// never re-resolved from its path), nothing else.
    pub fn logs(log_dir: &'a Dir) -> Self {
        Policy::new(Profile::Logs).fd(log_dir.fd(), Grant::ReadOnly)
    }

    /// `logs --cursor`: also write the cursor in its directory (the one
    /// open as `dir`): create, write and rename files there, and the
    /// rename system calls.
    pub fn cursor(mut self, dir: &'a Dir) -> Self {
        self.profile = Profile::LogsCursor;
        self.fd(dir.fd(), Grant::Cursor)
    }
}

/// Confines the calling process by `policy` (module docs), unless
/// `set_disabled` turned it off; logs what is in force once and returns
/// it (the daemon keeps it for `status`, and passes whether it confined
/// itself to what depends on it: no process-wide state). A layer the
/// kernel refuses is reported in the status and a warning, never a
/// failure: capture must go on.
pub fn confine(policy: &Policy<'_>) -> Status {
    let status = if DISABLED.load(Ordering::Relaxed) {
        Status::off()
    } else {
        confine_now(policy)
    };
    // `logs` run by a user other than root cannot empty its capability
    // bounding set (that takes CAP_SETPCAP); it holds no capability and
    // no_new_privs keeps any from coming back, so that is no gap: said at
    // debug level, not as a warning on every run.
    let reader = matches!(policy.profile, Profile::Logs | Profile::LogsCursor);
    let bounding_only = Status {
        capabilities: "none".into(),
        ..status.clone()
    };
    if reader && status.capabilities.starts_with("none (") && bounding_only.is_full() {
        tracing::debug!(
            capabilities = %status.capabilities,
            landlock = %status.landlock,
            seccomp = %status.seccomp,
            "sandbox in force (the bounding set needs no emptying without capabilities)"
        );
    } else if status.is_full() || status == Status::off() {
        tracing::info!(
            no_new_privs = status.no_new_privs,
            capabilities = %status.capabilities,
            landlock = %status.landlock,
            seccomp = %status.seccomp,
            "sandbox"
        );
    } else {
        tracing::warn!(
            no_new_privs = status.no_new_privs,
            capabilities = %status.capabilities,
            landlock = %status.landlock,
            seccomp = %status.seccomp,
            "sandbox only partly in force"
        );
    }
    status
}

fn confine_now(policy: &Policy<'_>) -> Status {
    let threads = thread_count();
    if threads > 1 {
        tracing::warn!(
            threads,
            "confining with more than one thread: only seccomp (and Landlock from ABI 8) cover the others"
        );
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes no pointers.
    let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == 0;
    let capabilities = drop_capabilities();
    let landlock = landlock(policy);
    let seccomp = seccomp(policy.profile);
    Status {
        no_new_privs: nnp,
        capabilities,
        landlock,
        seccomp,
    }
}

/// Threads in this process (1 when it cannot tell).
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Empties the bounding, ambient, effective, permitted and inheritable
/// sets; says `"none"` or what is left.
fn drop_capabilities() -> String {
    let bounding_kept = drop_bounding_set();
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes no pointers; failing (an old
    // kernel without ambient capabilities) leaves nothing to clear.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset reads a v3 header and two data structs, both live and
    // laid out as the kernel's (repr(C), three u32 each).
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if rc != 0 {
        return format!("kept (capset: {})", std::io::Error::last_os_error());
    }
    if bounding_kept > 0 {
        // Only without CAP_SETPCAP (not root): no_new_privs keeps an exec
        // from regaining them anyway.
        return format!("none (bounding set kept: {bounding_kept} without CAP_SETPCAP)");
    }
    "none".into()
}

/// Empties the capability bounding set; returns how many capabilities
/// stay in it (only without CAP_SETPCAP). Dropping a capability the set
/// lacks succeeds, so with CAP_SETPCAP (root) it is one `prctl` per
/// capability, not a read and a drop: 41 system calls fewer at every
/// start (docs/performance.md, start-up). Without it the first drop fails
/// and the rest of the set is only read, to be reported.
fn drop_bounding_set() -> u32 {
    let mut kept = 0u32;
    let mut can_drop = true;
    for cap in 0..64 {
        if can_drop {
            // SAFETY: PR_CAPBSET_READ/DROP take an integer, no pointers.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } == 0 {
                continue;
            }
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                break; // Past the last capability.
            }
            can_drop = false; // EPERM: no CAP_SETPCAP.
        }
        // SAFETY: as above.
        match unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) } {
            1 => kept += 1,
            0 => {}
            _ => break, // EINVAL: past the last capability.
        }
    }
    kept
}

/// The Landlock ABI whose rights are handled (module docs).
const LANDLOCK_ABI: ABI = ABI::V7;

/// Whether `NOTIFY_SOCKET` names an abstract socket, which scoping would cut.
fn notify_socket_is_abstract() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some_and(|v| v.as_encoded_bytes().first() == Some(&b'@'))
}

fn landlock(policy: &Policy<'_>) -> String {
    match landlock_inner(policy) {
        Ok(s) => s,
        Err(e) => format!("error: {e}"),
    }
}

fn landlock_inner(policy: &Policy<'_>) -> Result<String, Box<dyn std::error::Error>> {
    let mut scopes = Scope::from_all(LANDLOCK_ABI);
    if notify_socket_is_abstract() {
        scopes.remove(Scope::AbstractUnixSocket);
    }
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(LANDLOCK_ABI))?
        .handle_access(AccessNet::from_all(LANDLOCK_ABI))?
        .scope(scopes)?
        .create()?;
    for (target, grant) in &policy.rules {
        let fd: OwnedFd = match target {
            Target::Fd(fd) => fd.try_clone_to_owned()?,
            Target::Path(p) => match PathFd::new(p) {
                Ok(fd) => fd.as_fd().try_clone_to_owned()?,
                // A missing directory gets no rule: nothing there to allow
                // (the command reports it by itself).
                Err(e) => {
                    tracing::debug!(path = %p.display(), error = %e, "no Landlock rule");
                    continue;
                }
            },
        };
        ruleset = ruleset.add_rule(PathBeneath::new(fd, grant.access()))?;
    }
    let st = ruleset.restrict_self()?;
    let abi = match st.landlock {
        LandlockStatus::Available { effective_abi, .. } => effective_abi as i32,
        _ => 0,
    };
    Ok(match st.ruleset {
        RulesetStatus::FullyEnforced => format!("ABI {abi}, enforced"),
        RulesetStatus::PartiallyEnforced => format!("partial (ABI {abi})"),
        RulesetStatus::NotEnforced => "unsupported".into(),
    })
}

fn seccomp(profile: Profile) -> String {
    let arch = match seccompiler::TargetArch::try_from(std::env::consts::ARCH) {
        Ok(a) => a,
        Err(_) => return "unsupported".into(),
    };
    let filter = match build_filter(profile, arch) {
        Ok(f) => f,
        Err(e) => return format!("error: {e}"),
    };
    match seccompiler::apply_filter_all_threads(&filter) {
        Ok(()) => "filter".into(),
        Err(e) => format!("error: {e}"),
    }
}

/// Compiles `profile`'s allow-list for `arch` into a compact BPF program:
/// the architecture check, then a binary search on the system call number
/// over `rules` (a run of consecutive numbers allowed without argument
/// checks is one range), whose leaves allow, deny with `ENOSYS`, or check
/// an argument.
///
/// Why not seccompiler's own compiler: it emits a linear chain, one
/// comparison (and four more instructions) per allowed call, 558
/// instructions for `run`, and installing a filter makes the kernel run it
/// once for every system call number (to cache the answers that do not
/// depend on arguments): about 0.3 ms of every daemon's start. The tree is
/// a fraction of that size and answers any number in a few comparisons;
/// its decisions are seccompiler's for every number and argument tried
/// (`tests::the_compact_filter_decides_like_the_linear_one`).
pub fn build_filter(
    profile: Profile,
    arch: seccompiler::TargetArch,
) -> Result<seccompiler::BpfProgram, seccompiler::Error> {
    // From <linux/audit.h>: the ELF machine, 64-bit, little-endian.
    let audit_arch = match arch {
        seccompiler::TargetArch::x86_64 => 0xC000_003E,
        seccompiler::TargetArch::aarch64 => 0xC000_00B7,
        seccompiler::TargetArch::riscv64 => 0xC000_00F3,
    };
    let rules = rules(profile);
    let mut prog = vec![
        bpf_load(SECCOMP_DATA_ARCH),
        bpf_jump(libc::BPF_JEQ, audit_arch, 1, 0)?,
        bpf_ret(libc::SECCOMP_RET_KILL_PROCESS),
        bpf_load(SECCOMP_DATA_NR),
    ];
    prog.extend(bpf_tree(&segments(&rules))?);
    Ok(prog)
}

/// Offsets in `struct seccomp_data`.
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
const SECCOMP_DATA_ARGS: u32 = 16;

/// What the filter answers.
const RET_DENY: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

/// An argument check: the low 32 bits of argument `arg` (as seccompiler's
/// `Dword` compares), and-ed with `mask`, must be one of `values`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ArgIn {
    arg: u8,
    mask: u32,
    values: Vec<u32>,
}

/// Every system call `profile` allows, with the argument check of those
/// that have one: [`syscalls`] without, `socket` and `socketpair` for
/// `AF_UNIX` only, `ioctl` for the handful of requests logmon and its
/// runtime make, `tgkill` to this process only (`abort`), and `logs`'
/// `clone` for threads only (`CLONE_THREAD` set).
fn rules(profile: Profile) -> BTreeMap<i64, Option<ArgIn>> {
    let one_of = |arg: u8, values: &[u32]| {
        Some(ArgIn {
            arg,
            mask: u32::MAX,
            values: values.to_vec(),
        })
    };
    let mut rules: BTreeMap<i64, Option<ArgIn>> =
        syscalls(profile).into_iter().map(|nr| (nr, None)).collect();
    rules.insert(libc::SYS_socket, one_of(0, &[libc::AF_UNIX as u32]));
    rules.insert(libc::SYS_socketpair, one_of(0, &[libc::AF_UNIX as u32]));
    rules.insert(
        libc::SYS_ioctl,
        one_of(
            1,
            &[
                libc::FIONREAD,
                libc::FIONBIO,
                libc::FIOCLEX,
                libc::FIONCLEX,
                libc::TCGETS,
                libc::TIOCGWINSZ,
            ]
            // The request type differs between libc targets.
            .map(|r| {
                #[allow(clippy::unnecessary_cast)]
                let r = r as u32;
                r
            }),
        ),
    );
    rules.insert(libc::SYS_tgkill, one_of(0, &[std::process::id()]));
    if matches!(
        profile,
        Profile::Logs | Profile::LogsCursor | Profile::RunCompress
    ) {
        let thread = libc::CLONE_THREAD as u32;
        rules.insert(
            libc::SYS_clone,
            Some(ArgIn {
                arg: 0,
                mask: thread,
                values: vec![thread],
            }),
        );
    }
    rules
}

/// The filter's answer for a run of system call numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict<'a> {
    Allow,
    Deny,
    Check(&'a ArgIn),
}

/// The number line cut where the verdict changes: `(first number,
/// verdict)`, each up to the next one's first number, from 0 on.
fn segments<'a>(rules: &'a BTreeMap<i64, Option<ArgIn>>) -> Vec<(u32, Verdict<'a>)> {
    let mut out: Vec<(u32, Verdict<'a>)> = Vec::new();
    let mut push = |start: u32, v: Verdict<'a>| match (out.last(), v) {
        (Some(&(_, last)), Verdict::Allow | Verdict::Deny) if last == v => {}
        _ => out.push((start, v)),
    };
    let mut next = 0u32;
    // `seccomp_data.nr` is unsigned: a negative number is never called.
    for (nr, check) in rules
        .iter()
        .filter_map(|(&nr, c)| Some((u32::try_from(nr).ok()?, c)))
    {
        if nr > next {
            push(next, Verdict::Deny);
        }
        push(nr, check.as_ref().map_or(Verdict::Allow, Verdict::Check));
        next = nr.saturating_add(1);
    }
    push(next, Verdict::Deny);
    out
}

/// The binary search over `segs` (the syscall number loaded): a split
/// jumps to its right half when the number is at or above that half's
/// first number, and falls through into its left half.
fn bpf_tree(
    segs: &[(u32, Verdict<'_>)],
) -> Result<Vec<seccompiler::sock_filter>, seccompiler::Error> {
    let [(_, verdict)] = segs else {
        let mid = segs.len() / 2;
        let left = bpf_tree(&segs[..mid])?;
        let mut out = vec![bpf_jump(libc::BPF_JGE, segs[mid].0, left.len(), 0)?];
        out.extend(left);
        out.extend(bpf_tree(&segs[mid..])?);
        return Ok(out);
    };
    Ok(match verdict {
        Verdict::Allow => vec![bpf_ret(libc::SECCOMP_RET_ALLOW)],
        Verdict::Deny => vec![bpf_ret(RET_DENY)],
        Verdict::Check(c) => {
            let mut out = vec![bpf_load(SECCOMP_DATA_ARGS + 8 * u32::from(c.arg))];
            if c.mask != u32::MAX {
                out.push(bpf_stmt(
                    libc::BPF_ALU | libc::BPF_AND | libc::BPF_K,
                    c.mask,
                ));
            }
            // Each match jumps over the rest to the final allow.
            let n = c.values.len();
            for (i, &v) in c.values.iter().enumerate() {
                out.push(bpf_jump(libc::BPF_JEQ, v, n - i, 0)?);
            }
            out.extend([bpf_ret(RET_DENY), bpf_ret(libc::SECCOMP_RET_ALLOW)]);
            out
        }
    })
}

fn bpf_stmt(code: u32, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter {
        // Opcodes are 16 bits; libc spells them as u32.
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn bpf_load(offset: u32) -> seccompiler::sock_filter {
    bpf_stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset)
}

fn bpf_ret(k: u32) -> seccompiler::sock_filter {
    bpf_stmt(libc::BPF_RET | libc::BPF_K, k)
}

/// A conditional jump on `A <code> k`, skipping `jt` or `jf` instructions
/// (at most 255: cBPF jumps only forward, by a byte).
fn bpf_jump(
    code: u32,
    k: u32,
    jt: usize,
    jf: usize,
) -> Result<seccompiler::sock_filter, seccompiler::Error> {
    let skip = |n: usize| {
        u8::try_from(n)
            .map_err(|_| seccompiler::Error::Backend(seccompiler::BackendError::FilterTooLarge(n)))
    };
    Ok(seccompiler::sock_filter {
        code: (libc::BPF_JMP | code | libc::BPF_K) as u16,
        jt: skip(jt)?,
        jf: skip(jf)?,
        k,
    })
}

/// The system calls `profile` keeps without argument checks (`socket`,
/// `socketpair`, `ioctl`, `tgkill` and `logs`' `clone` are added with
/// theirs). Found with `strace -f` of a daemon through rotation, purge,
/// Reopen, a vanished file, disk full, stats, Stop and SIGTERM, and of
/// `logs -f` across rotations.
pub fn syscalls(profile: Profile) -> Vec<i64> {
    let mut v = [RUNTIME_CALLS, FILE_CALLS, EVENT_CALLS].concat();
    #[cfg(target_arch = "x86_64")]
    v.extend_from_slice(LEGACY_CALLS);
    if matches!(profile, Profile::Logs | Profile::LogsCursor) {
        v.extend_from_slice(WATCHER_CALLS);
    }
    if profile == Profile::RunCompress {
        v.extend_from_slice(THREAD_CALLS);
    }
    // `run`: a purged file's index renamed to the next file's, within
    // the log directory (Landlock allows no other rename, see above).
    // `logs --cursor`: the temporary file renamed over the cursor.
    if matches!(
        profile,
        Profile::Run | Profile::RunCompress | Profile::LogsCursor
    ) {
        v.extend([libc::SYS_renameat, libc::SYS_renameat2]);
        #[cfg(target_arch = "x86_64")]
        v.push(libc::SYS_rename);
    }
    v
}

/// Memory, signals, time, identity: Rust's runtime (and tokio's in
/// `logs`).
const RUNTIME_CALLS: &[i64] = &[
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_futex,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_getrandom,
    libc::SYS_prlimit64,
    // The pump's own involuntary context switches (its splice piece).
    libc::SYS_getrusage,
    libc::SYS_uname,
];

/// Files and pipes: capture, rotation, purge, Reopen, the lock.
const FILE_CALLS: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_lseek,
    libc::SYS_close,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_getdents64,
    libc::SYS_unlinkat,
    // Landlock answers it (EACCES) when the log directory is recreated.
    libc::SYS_mkdirat,
    libc::SYS_readlinkat,
    libc::SYS_flock,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    // futimens: a trimmed preallocation keeps its mtime.
    libc::SYS_utimensat,
    libc::SYS_splice,
    libc::SYS_tee,
    libc::SYS_pipe2,
];

/// The event loop, signals, the control socket, sd_notify, journald.
const EVENT_CALLS: &[i64] = &[
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_ppoll,
    libc::SYS_signalfd4,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_shutdown,
];

/// The older forms of those calls that x86_64 still has (and std uses).
#[cfg(target_arch = "x86_64")]
const LEGACY_CALLS: &[i64] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_unlink,
    // std's create_dir_all (a deleted log directory recreated).
    libc::SYS_mkdir,
    libc::SYS_readlink,
    libc::SYS_access,
    libc::SYS_dup2,
    libc::SYS_pipe,
    libc::SYS_poll,
    libc::SYS_epoll_wait,
    libc::SYS_accept,
    libc::SYS_arch_prctl,
];

/// What a new thread calls as it starts (`run --compress`'s compressor).
const THREAD_CALLS: &[i64] = &[libc::SYS_set_robust_list, libc::SYS_rseq, libc::SYS_prctl];

/// The `notify` watcher of `logs`: its thread and inotify.
const WATCHER_CALLS: &[i64] = &[
    libc::SYS_inotify_init1,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_rm_watch,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_prctl,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic BPF seccomp program on `(nr, arch, args)`, as the
    /// kernel does (only the instructions the two compilers emit).
    fn run_bpf(prog: &[seccompiler::sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let word = |off: u32| -> u32 {
            match off {
                0 => nr,
                4 => arch,
                o if o >= 16 && (o - 16) % 4 == 0 && o < 64 => {
                    let a = args[((o - 16) / 8) as usize];
                    if (o - 16) % 8 == 0 {
                        a as u32
                    } else {
                        (a >> 32) as u32
                    }
                }
                o => panic!("load of offset {o}"),
            }
        };
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let i = &prog[pc];
            let code = u32::from(i.code);
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => acc = word(i.k),
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => acc &= i.k,
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += i.k as usize,
                c => {
                    let taken = match c & !(libc::BPF_JMP | libc::BPF_K) {
                        x if x == libc::BPF_JEQ => acc == i.k,
                        x if x == libc::BPF_JGE => acc >= i.k,
                        x if x == libc::BPF_JGT => acc > i.k,
                        _ => panic!("opcode {c:#x}"),
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
            }
        }
    }

    /// The same rules through seccompiler's own (linear) compiler.
    fn linear_filter(profile: Profile, arch: seccompiler::TargetArch) -> seccompiler::BpfProgram {
        use seccompiler::{
            SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond,
            SeccompFilter, SeccompRule,
        };
        let rules = rules(profile)
            .into_iter()
            .map(|(nr, check)| {
                let chain = check.map_or_else(Vec::new, |c| {
                    c.values
                        .iter()
                        .map(|&v| {
                            let op = if c.mask == u32::MAX {
                                Op::Eq
                            } else {
                                Op::MaskedEq(u64::from(c.mask))
                            };
                            let cond = Cond::new(c.arg, Len::Dword, op, u64::from(v)).unwrap();
                            SeccompRule::new(vec![cond]).unwrap()
                        })
                        .collect()
                });
                (nr, chain)
            })
            .collect();
        let f = SeccompFilter::new(
            rules,
            SeccompAction::Errno(libc::ENOSYS as u32),
            SeccompAction::Allow,
            arch,
        )
        .unwrap();
        f.try_into().unwrap()
    }

    #[test]
    fn the_compact_filter_decides_like_the_linear_one() {
        let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH).unwrap();
        // Its own architecture's value, read off the linear program.
        let audit = linear_filter(Profile::Run, arch)[1].k;
        let pid = u64::from(std::process::id());
        // Values the argument checks look at, with and without high bits
        // (a Dword check ignores them).
        let mut values = vec![0u64, 1, 2, 10, pid, pid + 1, u64::MAX];
        values.extend(
            [
                libc::AF_UNIX as u64,
                libc::AF_INET as u64,
                libc::CLONE_THREAD as u64,
                (libc::CLONE_THREAD | libc::CLONE_VM) as u64,
                libc::CLONE_VM as u64,
            ]
            .into_iter()
            .chain(
                [
                    libc::FIONREAD,
                    libc::TCGETS,
                    libc::TIOCGWINSZ,
                    libc::TIOCSTI,
                ]
                .map(|r| {
                    #[allow(clippy::unnecessary_cast)]
                    let r = r as u64;
                    r
                }),
            ),
        );
        let high: Vec<u64> = values.iter().map(|v| v | 1 << 40).collect();
        values.extend(high);
        let numbers = (0..1024u32).chain([0x4000_0000, 0x4000_0001, u32::MAX - 1, u32::MAX]);
        for p in [
            Profile::Run,
            Profile::RunCompress,
            Profile::Logs,
            Profile::LogsCursor,
        ] {
            let compact = build_filter(p, arch).unwrap();
            let linear = linear_filter(p, arch);
            assert!(
                compact.len() * 2 < linear.len(),
                "{} instructions",
                compact.len()
            );
            for nr in numbers.clone() {
                for a in [audit, audit ^ 1] {
                    for &v in &values {
                        for args in [[v, 0, 0, 0, 0, 0], [0, v, 0, 0, 0, 0], [v; 6]] {
                            assert_eq!(
                                run_bpf(&compact, nr, a, args),
                                run_bpf(&linear, nr, a, args),
                                "{p:?}: syscall {nr}, arch {a:#x}, args {args:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn both_filters_compile_for_this_target() {
        let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH).unwrap();
        for p in [Profile::Run, Profile::Logs, Profile::LogsCursor] {
            assert!(!build_filter(p, arch).unwrap().is_empty());
        }
    }

    #[test]
    fn run_cannot_start_threads_or_programs_and_logs_cannot_exec() {
        let run = syscalls(Profile::Run);
        let logs = syscalls(Profile::Logs);
        for nr in [
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_kill,
            libc::SYS_setuid,
            libc::SYS_mount,
        ] {
            assert!(!run.contains(&nr), "run allows syscall {nr}");
            if nr != libc::SYS_clone {
                assert!(!logs.contains(&nr), "logs allows syscall {nr}");
            }
        }
    }

    #[test]
    fn off_is_not_full_and_says_why() {
        let s = Status::off();
        assert!(!s.is_full());
        assert_eq!(s.landlock, "off (--no-sandbox)");
        let full = Status {
            no_new_privs: true,
            capabilities: "none".into(),
            landlock: "ABI 7, enforced".into(),
            seccomp: "filter".into(),
        };
        assert!(full.is_full());
        assert_eq!(
            serde_json::to_value(&full).unwrap(),
            serde_json::json!({"no_new_privs": true, "capabilities": "none",
                "landlock": "ABI 7, enforced", "seccomp": "filter"})
        );
    }

    #[test]
    fn rules_come_from_the_descriptors_opened_at_start() {
        use std::os::fd::AsRawFd;
        use std::path::Path;
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let again = Dir::open(d.path()).unwrap();
        let same = Policy::run(&dir, Some(&again));
        // The log dir and /dev/null: never the log dir's parent.
        assert_eq!(same.rules.len(), 2);
        assert!(
            matches!(same.rules[0], (Target::Fd(fd), Grant::LogDir) if fd.as_raw_fd() == dir.fd().as_raw_fd()),
            "{:?}",
            same.rules
        );
        assert!(
            matches!(same.rules[1], (Target::Path(ref p), Grant::WriteFile) if p == Path::new("/dev/null"))
        );
        let s = tempfile::tempdir().unwrap();
        let sock = Dir::open(s.path()).unwrap();
        // The task swaps the socket directory's path for a symlink before
        // logmon confines itself: the rule is still on the directory
        // opened at start, never on where the path leads now.
        let moved = s.path().with_extension("moved");
        std::fs::rename(s.path(), &moved).unwrap();
        std::os::unix::fs::symlink("/etc", s.path()).unwrap();
        let other = Policy::run(&dir, Some(&sock));
        assert_eq!(other.rules.len(), 3);
        assert_eq!(other.rules[2].1, Grant::RemoveFiles);
        assert!(
            matches!(other.rules[2].0, Target::Fd(fd) if fd.as_raw_fd() == sock.fd().as_raw_fd()),
            "{:?}",
            other.rules[2].0
        );
        // `logs` too: the directory it opened, not where its path leads.
        let logs = Policy::logs(&sock);
        assert!(
            matches!(logs.rules[..], [(Target::Fd(fd), Grant::ReadOnly)] if fd.as_raw_fd() == sock.fd().as_raw_fd()),
            "{:?}",
            logs.rules
        );
        std::fs::remove_file(s.path()).unwrap();
        std::fs::rename(&moved, s.path()).unwrap();
    }
}
