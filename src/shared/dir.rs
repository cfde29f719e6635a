//! Directory handles: the only way logmon touches a name inside a directory
//! it shares with the task (docs/design.md §9).
//!
//! The task may create, rename and remove names in the log directory (the
//! reference makes it 0777) at any moment, racing every step. So a [`Dir`]
//! is opened once, from the path the operator gave, and every later access
//! is relative to its descriptor and names exactly one component:
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`
//! where the kernel has it (else `openat` with `O_NOFOLLOW`), `unlinkat`,
//! `mkfifoat`, `fstatat(AT_SYMLINK_NOFOLLOW)`, listing through the
//! descriptor, and `/proc/self/fd/<fd>/<name>` for the socket calls that
//! only take a path. A path string inside the directory is never walked
//! again, so a directory renamed away or replaced by a symlink mid-run does
//! not redirect logmon: it goes on in the directory it opened.
//!
//! Guarantees kept here, and the tests that prove them (unit tests below;
//! `tests/it/daemon/hostile.rs` and `tests/it/daemon/hostile_layout.rs` run
//! the attacks through the binary):
//! - the operator's path is resolved from `/` one component at a time,
//!   and a symlink on it is followed only where no user but root and
//!   logmon could have planted it; a directory logmon writes in belongs
//!   to root, to logmon's uid, or to a uid accepted with
//!   `LOGMON_ACCEPT_DIR_OWNER` ([`Dir::open`], [`Dir::open_owned`]:
//!   `a_planted_symlink_on_the_path_is_refused_by_name`,
//!   `a_directory_of_another_owner_is_refused_unless_accepted`);
//! - one trust rule for every reader of a shared directory
//!   ([`Trust::not_logmons`], [`Dir::open_trusted`]: the expected kind,
//!   owned by root or the reader, never by the directory's owner:
//!   `open_trusted_opens_only_what_logmon_made`);
//! - [`Dir::replace`] writes a file whole or not at all (temp `O_EXCL`,
//!   fsync, rename, fsync of the directory:
//!   `replace_is_atomic_and_never_writes_through_a_planted_name`);
//! - a name is never followed: a symlink, at any component, fails with
//!   `ELOOP`/`EXDEV` (`a_symlink_is_never_followed`);
//! - [`Dir::create_own`] never opens an existing name: whatever sits there
//!   (symlink, hard link, FIFO, device, directory, foreign file) is removed
//!   — removing a name never touches its target — and counted, or, when it
//!   cannot be removed (a non-empty directory), reported as
//!   [`Claim::Occupied`] so the caller moves on
//!   (`a_planted_name_is_removed_and_never_written_through`);
//! - [`Dir::open_own`] opens an existing name only if what it opened is a
//!   regular file with one link owned by logmon's euid, checked with
//!   `fstat` after the open (`open_own_refuses_foreign_files`);
//! - a deleted directory is recreated only through the parent descriptor
//!   held since start ([`Dir::recreate`], sticky), and only if the result
//!   is a directory owned by logmon
//!   (`a_deleted_directory_is_recreated_through_its_parent`);
//! - [`Dir::make_sticky`] adds `S_ISVTX` and nothing else, through the
//!   descriptor, when logmon owns the directory or is root, and says why
//!   not otherwise (`make_sticky_adds_only_the_sticky_bit_and_says_why_not`);
//! - [`Dir::subdir`] creates (`mkdirat`) and opens a directory without
//!   following a symlink (the control socket's directory), and
//!   [`Dir::open_path_fd`] gives an `O_PATH` handle of the very inode at a
//!   name (to chmod the socket just bound, never a name swapped since).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

/// How many times a name is claimed (remove what sits there, create ours)
/// before [`Dir::create_own`] gives up on it: an attacker replanting the
/// name as fast as it can wins a race at most this often in a row.
const CLAIM_ATTEMPTS: usize = 8;

/// The identity of a file: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileId {
    /// The identity in a `stat` result.
    pub fn of(st: &FileStat) -> FileId {
        FileId {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.dev, self.ino)
    }
}

/// What a name inside a directory is, in words for messages and counters.
pub fn kind_of(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFLNK => "symlink",
        SFlag::S_IFIFO => "FIFO",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "character device",
        SFlag::S_IFBLK => "block device",
        _ => "special file",
    }
}

/// Whether `st` is of file type `t`.
pub fn is_type(st: &FileStat, t: SFlag) -> bool {
    st.st_mode & SFlag::S_IFMT.bits() == t.bits()
}

/// Why an existing name is not logmon's own regular file, or `None` if it
/// is one: a regular file with exactly one link, owned by our euid.
pub fn foreign_reason(st: &FileStat) -> Option<String> {
    if !is_type(st, SFlag::S_IFREG) {
        return Some(kind_of(st).to_owned());
    }
    if st.st_nlink != 1 {
        return Some(format!("hard link ({} links)", st.st_nlink));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if st.st_uid != euid {
        return Some(format!("file owned by uid {}", st.st_uid));
    }
    None
}

/// The outcome of claiming a name for a new file of logmon's own.
#[derive(Debug)]
pub enum Claim {
    /// The file was created, empty, and is logmon's. `removed` lists what
    /// sat at the name before and was removed (one entry per removal).
    Created {
        /// The new file.
        file: File,
        /// What was removed from the name first.
        removed: Vec<String>,
    },
    /// The name is held by something that cannot be removed (a non-empty
    /// directory, or an attacker that kept replanting it): use another.
    Occupied {
        /// What holds it.
        by: String,
        /// What was removed from the name before giving up.
        removed: Vec<String>,
    },
}

/// A directory logmon works in, opened once; every name inside it is
/// resolved from its descriptor (see the module docs).
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// The path it was opened by: for messages only, never walked again.
    path: PathBuf,
    id: FileId,
    /// The parent directory and this directory's name in it, held from the
    /// start, so a deleted directory can be recreated without walking a
    /// path ([`Dir::recreate`]).
    parent: Option<(Arc<OwnedFd>, OsString)>,
    /// Whether its deletion was already reported ([`Dir::first_notice_of_deletion`]).
    deletion_noticed: AtomicBool,
}

/// A replacement of one file in a [`Dir`] under way ([`Dir::replace`] in
/// two steps): [`Replacement::start`] creates the temp file, so a
/// directory where nothing can be written fails before the caller acts;
/// [`Replacement::commit`] writes, `fsync`s, renames it over the name and
/// `fsync`s the directory. Dropped uncommitted, the temp file is removed.
/// `D` is the directory, borrowed or owned.
#[derive(Debug)]
pub struct Replacement<D: std::borrow::Borrow<Dir>> {
    dir: D,
    name: OsString,
    /// Emptied once renamed: nothing left to remove.
    tmp: OsString,
    file: Option<File>,
}

impl<D: std::borrow::Borrow<Dir>> Replacement<D> {
    /// Creates the temp file `.<name>.tmp.<pid>` in `dir` afresh
    /// ([`Dir::create_own`]: whatever sits at that name is removed, never
    /// opened), mode 0600. The error is the one creating it gave.
    pub fn start(dir: D, name: impl AsRef<OsStr>) -> io::Result<Self> {
        let name = one_component(name.as_ref())?.to_owned();
        let mut tmp = OsString::from(".");
        tmp.push(&name);
        tmp.push(format!(".tmp.{}", std::process::id()));
        let d = dir.borrow();
        let file = match d.create_own(&tmp, OFlag::O_WRONLY, Mode::from_bits_truncate(0o600))? {
            Claim::Created { file, .. } => file,
            Claim::Occupied { by, .. } => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} is taken by a {by}", d.display(&tmp).display()),
                ))
            }
        };
        Ok(Replacement {
            dir,
            name,
            tmp,
            file: Some(file),
        })
    }

    /// Writes `bytes`, makes them durable and puts them in place at the
    /// name atomically, then makes the rename durable.
    pub fn commit(mut self, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        let Some(mut file) = self.file.take() else {
            return Err(io::Error::other("replacement already committed"));
        };
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        self.dir.borrow().rename(&self.tmp, &self.name)?;
        self.tmp.clear();
        self.dir.borrow().sync()
    }
}

impl<D: std::borrow::Borrow<Dir>> Drop for Replacement<D> {
    fn drop(&mut self) {
        if !self.tmp.is_empty() {
            let _ = self.dir.borrow().remove(&self.tmp);
        }
    }
}

/// Whether `openat2` exists here (Linux ≥ 5.6); learnt at the first call.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Why the log directory could not be opened ([`Dir::open_log_dir`]):
/// the one check of `--log-dir`, shared by `run`, `ensure`/`exec` (before
/// anything is launched) and `logs`.
#[derive(Debug, thiserror::Error)]
pub enum LogDirError {
    /// Nothing at the path, or not a directory.
    #[error("log directory {} does not exist or is not a directory: create it first, or check --log-dir", path.display())]
    Missing {
        /// The directory.
        path: PathBuf,
    },
    /// It belongs to a user other than root and logmon's, not accepted with
    /// `LOGMON_ACCEPT_DIR_OWNER`: a task may have put it there.
    #[error("{} belongs to uid {owner}, not to logmon's uid {euid}: a task may have replaced it; check it, then chown it to uid {euid}, or accept its owner with LOGMON_ACCEPT_DIR_OWNER={owner}", path.display())]
    Foreign {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// logmon's uid.
        euid: u32,
    },
    /// It is there but cannot be opened (permissions, I/O, a planted
    /// symlink on its path).
    #[error("cannot open log directory {}: {source}", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

impl Dir {
    /// Opens the log directory at `path` for writing in it ([`Dir::open_owned`]:
    /// no planted symlink followed, owned by logmon's uid or an accepted
    /// one); a missing one, or a non-directory, is [`LogDirError::Missing`].
    pub fn open_log_dir(path: &Path) -> Result<Dir, LogDirError> {
        Dir::open_owned(path)
    }

    /// Opens the log directory at `path` for reading ([`Dir::open`]: no
    /// planted symlink followed, any owner: readers trust files, not the
    /// directory); a missing one, or a non-directory, is
    /// [`LogDirError::Missing`].
    pub fn open_log_dir_to_read(path: &Path) -> Result<Dir, LogDirError> {
        Dir::open(path).map_err(|source| match source.raw_os_error() {
            Some(c) if c == Errno::ENOENT as i32 || c == Errno::ENOTDIR as i32 => {
                LogDirError::Missing {
                    path: path.to_path_buf(),
                }
            }
            _ => LogDirError::Io {
                path: path.to_path_buf(),
                source,
            },
        })
    }

    /// Opens the directory at `path`, resolved from `/` one component at
    /// a time: a symlink is followed only where no user but root and
    /// logmon could have planted it, so a link a task made in a directory
    /// it can write (the reference's 0777 `alloc/`) is refused naming it,
    /// never followed (`a_planted_symlink_on_the_path_is_refused_by_name`).
    /// Its parent is kept (for [`Dir::recreate`]).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let path = std::path::absolute(path)?;
        let (fd, parent) = resolve_dir(&path)?;
        let st = nix::sys::stat::fstat(&fd)?;
        Ok(Dir {
            fd,
            path,
            id: FileId::of(&st),
            parent: parent.map(|(fd, n)| (Arc::new(fd), n)),
            deletion_noticed: AtomicBool::new(false),
        })
    }

    /// [`Dir::open`] for a directory logmon writes in (the log directory,
    /// a FIFO's directory): refused unless it belongs to root, to logmon's
    /// uid or to a uid the operator accepted with `LOGMON_ACCEPT_DIR_OWNER`
    /// ([`ACCEPT_DIR_OWNER_ENV`]). A task that replaced the directory
    /// with one of its own is noticed here, at every start
    /// (`a_directory_of_another_owner_is_refused_unless_accepted`).
    pub fn open_owned(path: &Path) -> Result<Dir, LogDirError> {
        let dir = Dir::open_log_dir_to_read(path)?;
        let owner = dir.owner().map_err(|source| LogDirError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // Root's directory is fine: no task can have made it.
        if trusted_writer(owner) {
            return Ok(dir);
        }
        let accepted = std::env::var(ACCEPT_DIR_OWNER_ENV).ok();
        if accepted.as_deref().is_some_and(|v| !v.trim().is_empty())
            && owners_accepted_in(accepted.as_deref()).is_empty()
        {
            // A mistyped acceptance is said, not taken for "nobody".
            return Err(LogDirError::Io {
                path: path.to_path_buf(),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{ACCEPT_DIR_OWNER_ENV}={:?} is not a list of uids: give numbers, such as 1000 or 1000,1001",
                        accepted.unwrap_or_default()
                    ),
                ),
            });
        }
        if !accepted_owners().contains(&owner) {
            return Err(LogDirError::Foreign {
                path: path.to_path_buf(),
                owner,
                euid: euid(),
            });
        }
        Ok(dir)
    }

    /// The directory's owner, from an `fstat` of its descriptor.
    pub fn owner(&self) -> io::Result<u32> {
        Ok(nix::sys::stat::fstat(&self.fd)?.st_uid)
    }

    /// A handle of a directory already opened by the caller (`fd`, which
    /// must be a directory; `path` for messages only): used where a
    /// directory was reached through another handle with `O_NOFOLLOW`, so
    /// no path is walked again. It has no parent to [`Dir::recreate`] in.
    pub fn from_fd(fd: OwnedFd, path: PathBuf) -> io::Result<Dir> {
        let st = nix::sys::stat::fstat(&fd)?;
        if !is_type(&st, SFlag::S_IFDIR) {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", path.display()),
            ));
        }
        Ok(Dir {
            fd,
            path,
            id: FileId::of(&st),
            parent: None,
            deletion_noticed: AtomicBool::new(false),
        })
    }

    /// Opens the existing directory `name` inside this one without
    /// following a symlink (`ELOOP`/`ENOTDIR` for a symlink or a file)
    /// and without creating it; it has no parent to recreate it in.
    pub fn open_child(&self, name: impl AsRef<OsStr>) -> io::Result<Dir> {
        let name = one_component(name.as_ref())?;
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Dir::from_fd(fd, self.path.join(name))
    }

    /// Opens the directory `rel` below this one, component by component
    /// with [`Dir::open_child`], so a symlink anywhere on the way is never
    /// followed; an empty `rel` is this directory again (a handle of its
    /// own). The shipper's and `ls`'s walk below `--watch` reopen what
    /// they found with it.
    pub fn open_below(&self, rel: &[OsString]) -> io::Result<Dir> {
        let Some((first, rest)) = rel.split_first() else {
            let fd = nix::fcntl::openat(
                &self.fd,
                ".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            return Dir::from_fd(fd, self.path.clone());
        };
        let mut cur = self.open_child(first)?;
        for c in rest {
            cur = cur.open_child(c)?;
        }
        Ok(cur)
    }

    /// The path the directory was opened by (absolute), for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path()/name`, for messages only.
    pub fn display(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// The directory's device and inode.
    pub fn id(&self) -> FileId {
        self.id
    }

    /// The directory's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The parent directory's descriptor (`O_PATH`), held since
    /// [`Dir::open`] for [`Dir::recreate`] (without the sandbox: the
    /// sandbox grants the parent nothing, docs/design.md §10).
    pub fn parent_fd(&self) -> Option<BorrowedFd<'_>> {
        self.parent.as_ref().map(|(fd, _)| fd.as_fd())
    }

    /// What sits now at this directory's name in its parent
    /// (`fstatat(AT_SYMLINK_NOFOLLOW)` through the parent descriptor held
    /// since start, never the path): after a deletion, whether something
    /// was made there since. `None` when nothing is (or there is no
    /// parent).
    pub fn stat_at_name(&self) -> Option<FileStat> {
        let (parent, name) = self.parent.as_ref()?;
        nix::sys::stat::fstatat(
            parent.as_fd(),
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .ok()
    }

    /// Sets the sticky bit (`S_ISVTX`) on the directory, through its
    /// descriptor (`fchmod`; every other mode bit kept), so that a user
    /// who may write in it can no longer rename or remove other users'
    /// names there (docs/design.md §9). Done only when logmon owns the
    /// directory or runs as root; otherwise, or when `fchmod` fails (no
    /// `CAP_FOWNER`, a read-only or immutable directory), says why. Already
    /// sticky: nothing to do.
    pub fn make_sticky(&self) -> io::Result<()> {
        let st = nix::sys::stat::fstat(&self.fd)?;
        if st.st_mode & Mode::S_ISVTX.bits() != 0 {
            return Ok(());
        }
        let euid = nix::unistd::geteuid();
        if st.st_uid != euid.as_raw() && !euid.is_root() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "it is owned by uid {} and logmon runs as uid {euid}",
                    st.st_uid
                ),
            ));
        }
        let mode = Mode::from_bits_truncate(st.st_mode & 0o7777) | Mode::S_ISVTX;
        nix::sys::stat::fchmod(&self.fd, mode).map_err(io::Error::from)
    }

    /// `true` the first time it is called on this handle: a deleted
    /// directory that cannot be recreated is reported once, however many
    /// streams and retries run into it.
    pub fn first_notice_of_deletion(&self) -> bool {
        !self.deletion_noticed.swap(true, Ordering::Relaxed)
    }

    /// A path naming `name` inside this directory through its descriptor
    /// (`/proc/self/fd/<fd>/<name>`), for calls that only take a path
    /// (bind, connect). The kernel resolves it from the open directory;
    /// the final component is still followed by such calls, so check it
    /// with [`Dir::stat`] first.
    pub fn fd_path(&self, name: impl AsRef<OsStr>) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd())).join(name.as_ref())
    }

    /// Opens `name` with `flags` (and `mode` when creating), refusing
    /// symlinks anywhere and any escape from the directory.
    pub fn open_at(&self, name: impl AsRef<OsStr>, flags: OFlag, mode: Mode) -> io::Result<File> {
        let name = one_component(name.as_ref())?;
        let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            let how = OpenHow::new().flags(flags).mode(mode).resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            );
            match nix::fcntl::openat2(&self.fd, name, how) {
                Ok(fd) => return Ok(File::from(fd)),
                Err(Errno::ENOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(File::from(nix::fcntl::openat(&self.fd, name, flags, mode)?))
    }

    /// `fstatat(name, AT_SYMLINK_NOFOLLOW)`; `None` when nothing is there.
    pub fn stat(&self, name: impl AsRef<OsStr>) -> io::Result<Option<FileStat>> {
        let name = one_component(name.as_ref())?;
        match nix::sys::stat::fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the name `name` (never a directory); a missing name is fine.
    /// Removing a name never touches what a symlink points at.
    pub fn remove(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        let name = one_component(name.as_ref())?;
        match nix::unistd::unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes whatever sits at `name`, an empty directory included.
    /// Returns what it was, or `None` if nothing was there.
    pub fn remove_any(&self, name: impl AsRef<OsStr>) -> io::Result<Option<String>> {
        let name = name.as_ref();
        let Some(st) = self.stat(name)? else {
            return Ok(None);
        };
        let kind = kind_of(&st);
        let flag = if is_type(&st, SFlag::S_IFDIR) {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        match nix::unistd::unlinkat(&self.fd, one_component(name)?, flag) {
            Ok(()) | Err(Errno::ENOENT) => Ok(Some(kind.to_owned())),
            // Replaced by the other kind between the stat and the unlink.
            Err(Errno::EISDIR | Errno::ENOTDIR) => self.remove_any(name),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates a FIFO at `name`.
    pub fn mkfifo(&self, name: impl AsRef<OsStr>, mode: Mode) -> io::Result<()> {
        let name = one_component(name.as_ref())?;
        nix::unistd::mkfifoat(&self.fd, name, mode).map_err(io::Error::from)
    }

    /// The names in the directory (without `.` and `..`), read through the
    /// descriptor.
    pub fn list(&self) -> io::Result<Vec<OsString>> {
        self.list_matching(|_| true)
    }

    /// [`Dir::list`], keeping only the names `keep` accepts; the others
    /// are never copied. A log directory shared by many tasks holds
    /// mostly other tasks' names, and a daemon's start lists it four
    /// times (its rotators' scan and purge): copying every name cost
    /// about a microsecond per name of each start.
    pub fn list_matching(&self, keep: impl Fn(&[u8]) -> bool) -> io::Result<Vec<OsString>> {
        let mut d = nix::dir::Dir::openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut out = Vec::new();
        for e in d.iter() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." && keep(n) {
                out.push(OsStr::from_bytes(n).to_owned());
            }
        }
        Ok(out)
    }

    /// Creates `name` as a new file of logmon's own, opened with `flags`
    /// (`O_CREAT | O_EXCL` are added): anything already at the name is
    /// removed first and reported in [`Claim::Created::removed`], never
    /// opened or followed. A name that cannot be freed is
    /// [`Claim::Occupied`].
    pub fn create_own(
        &self,
        name: impl AsRef<OsStr>,
        flags: OFlag,
        mode: Mode,
    ) -> io::Result<Claim> {
        let name = name.as_ref();
        let mut removed = Vec::new();
        for _ in 0..CLAIM_ATTEMPTS {
            match self.open_at(name, flags | OFlag::O_CREAT | OFlag::O_EXCL, mode) {
                Ok(file) => return Ok(Claim::Created { file, removed }),
                Err(e) if e.raw_os_error() == Some(Errno::EEXIST as i32) => {}
                Err(e) => return Err(e),
            }
            match self.remove_any(name) {
                Ok(Some(kind)) => removed.push(kind),
                Ok(None) => {}
                Err(e) => {
                    let by = match e.raw_os_error() {
                        Some(c) if c == Errno::ENOTEMPTY as i32 || c == Errno::EEXIST as i32 => {
                            "non-empty directory".to_owned()
                        }
                        _ => format!("name that cannot be removed ({e})"),
                    };
                    return Ok(Claim::Occupied { by, removed });
                }
            }
        }
        Ok(Claim::Occupied {
            by: "name replanted on every attempt".to_owned(),
            removed,
        })
    }

    /// Opens the existing file `name` with `flags` only if it is logmon's
    /// own: a regular file with one link owned by our euid, checked on
    /// what was opened. `Ok(Err(reason))` when something else sits there;
    /// `Ok(Ok(None))` when nothing does.
    pub fn open_own(
        &self,
        name: impl AsRef<OsStr>,
        flags: OFlag,
    ) -> io::Result<Result<Option<File>, String>> {
        let name = name.as_ref();
        // A look first, so a device or FIFO is never even opened.
        match self.stat(name)? {
            None => return Ok(Ok(None)),
            Some(st) => {
                if let Some(why) = foreign_reason(&st) {
                    return Ok(Err(why));
                }
            }
        }
        let file = match self.open_at(name, flags | OFlag::O_NONBLOCK, Mode::empty()) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(Errno::ENOENT as i32) => return Ok(Ok(None)),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(c) if c == Errno::ELOOP as i32 || c == Errno::EXDEV as i32
                ) =>
            {
                return Ok(Err("symlink".to_owned()))
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(c) if c == Errno::EISDIR as i32 || c == Errno::ENXIO as i32
                ) =>
            {
                return Ok(Err("not a regular file".to_owned()))
            }
            Err(e) => return Err(e),
        };
        let st = nix::sys::stat::fstat(&file)?;
        if let Some(why) = foreign_reason(&st) {
            return Ok(Err(why));
        }
        // Writes to our own files block on nothing; drop the O_NONBLOCK
        // that kept the open from hanging on a swapped-in FIFO.
        let fl =
            OFlag::from_bits_truncate(nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)?);
        if !flags.contains(OFlag::O_NONBLOCK) {
            nix::fcntl::fcntl(
                &file,
                nix::fcntl::FcntlArg::F_SETFL(fl & !OFlag::O_NONBLOCK),
            )?;
        }
        Ok(Ok(Some(file)))
    }

    /// Renames `from` to `to`, both names inside this directory
    /// (`renameat` on the one descriptor): whatever sits at `to` is
    /// replaced as a name, never followed.
    pub fn rename(&self, from: impl AsRef<OsStr>, to: impl AsRef<OsStr>) -> io::Result<()> {
        let from = one_component(from.as_ref())?;
        let to = one_component(to.as_ref())?;
        nix::fcntl::renameat(&self.fd, from, &self.fd, to).map_err(io::Error::from)
    }

    /// Renames `from` to `to` inside this directory only if nothing sits
    /// at `to` (`renameat2(RENAME_NOREPLACE)`: `EEXIST` otherwise). What
    /// is moved is the name at `from`, whatever it is, never followed:
    /// callers check what they open at `to` afterwards.
    pub fn rename_noreplace(
        &self,
        from: impl AsRef<OsStr>,
        to: impl AsRef<OsStr>,
    ) -> io::Result<()> {
        let from = one_component(from.as_ref())?;
        let to = one_component(to.as_ref())?;
        nix::fcntl::renameat2(
            &self.fd,
            from,
            &self.fd,
            to,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )
        .map_err(io::Error::from)
    }

    /// Replaces the file `name` with `bytes`, durably and atomically: a
    /// temp file `.<name>.tmp.<pid>` created anew (`O_CREAT | O_EXCL |
    /// O_NOFOLLOW`, mode 0600; whatever a task planted at that name is
    /// removed first, never opened), written, `fsync`ed, `renameat` over
    /// `name` within this directory, then the directory `fsync`ed. A
    /// reader sees the old file or the new one, never a part
    /// (`replace_is_atomic_and_never_writes_through_a_planted_name`).
    /// [`Replacement`] is the same in two steps, for a caller that must
    /// know the file can be written before it does anything else.
    pub fn replace(&self, name: impl AsRef<OsStr>, bytes: &[u8]) -> io::Result<()> {
        Replacement::start(self, name)?.commit(bytes)
    }

    /// `fsync` of the directory itself, so a rename or a new name in it is
    /// durable.
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(&self.fd).map_err(io::Error::from)
    }

    /// An `O_PATH` descriptor of `name` itself (never following a
    /// symlink): to `fstat` or `fchmod` (through `/proc/self/fd`) the very
    /// inode that sits at the name, whatever it is, without opening it.
    pub fn open_path_fd(&self, name: impl AsRef<OsStr>) -> io::Result<OwnedFd> {
        let name = one_component(name.as_ref())?;
        // openat2 refuses any flag besides these with O_PATH.
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            let how = OpenHow::new().flags(flags).resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            );
            match nix::fcntl::openat2(&self.fd, name, how) {
                Ok(fd) => return Ok(fd),
                Err(Errno::ENOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(nix::fcntl::openat(&self.fd, name, flags, Mode::empty())?)
    }

    /// The directory `name` inside this one, created with `mode` when
    /// missing (`mkdirat`), opened without following a symlink; refused
    /// unless it is a directory. Its parent (this one) is kept for
    /// [`Dir::recreate`].
    pub fn subdir(&self, name: impl AsRef<OsStr>, mode: Mode) -> io::Result<Dir> {
        let name = one_component(name.as_ref())?;
        match nix::sys::stat::mkdirat(&self.fd, name, mode) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let st = nix::sys::stat::fstat(&fd)?;
        let parent = nix::fcntl::openat(
            &self.fd,
            ".",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir {
            fd,
            path: self.path.join(name),
            id: FileId::of(&st),
            parent: Some((Arc::new(parent), name.to_owned())),
            deletion_noticed: AtomicBool::new(false),
        })
    }

    /// What a reader may believe about names in this directory, from an
    /// `fstat` of its descriptor now ([`Trust`]).
    pub fn trust(&self) -> io::Result<Trust> {
        Ok(Trust::of(&nix::sys::stat::fstat(&self.fd)?))
    }

    /// Opens `name` read-only only if it holds a `kind` logmon made, by
    /// the one trust rule ([`Trust::not_logmons`] with `trust`, the
    /// directory's [`Dir::trust`]): a look first (a FIFO or device is
    /// never opened), then a non-blocking open without following a link,
    /// and the same rule on what was opened. Readers, the shipper, `ls`
    /// and the agent all open a file of a shared directory through here
    /// (`open_trusted_opens_only_what_logmon_made`).
    pub fn open_trusted(
        &self,
        trust: &Trust,
        name: impl AsRef<OsStr>,
        kind: Kind,
    ) -> io::Result<Opened> {
        let name = name.as_ref();
        match self.stat(name)? {
            None => return Ok(Opened::Gone),
            Some(st) => {
                if let Some(why) = trust.not_logmons(&st, kind) {
                    return Ok(Opened::Foreign(why));
                }
            }
        }
        let file = match self.open_at(name, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty()) {
            Ok(f) => f,
            Err(e) => {
                return match e.raw_os_error().map(Errno::from_raw) {
                    Some(Errno::ENOENT) => Ok(Opened::Gone),
                    Some(Errno::ELOOP | Errno::EXDEV) => Ok(Opened::Foreign("a symlink".into())),
                    // A socket, or a device without a driver.
                    Some(Errno::ENXIO | Errno::ENODEV) => {
                        Ok(Opened::Foreign("a special file".into()))
                    }
                    _ => Err(e),
                };
            }
        };
        let st = nix::sys::stat::fstat(&file)?;
        if let Some(why) = trust.not_logmons(&st, kind) {
            return Ok(Opened::Foreign(why));
        }
        // Reads of logmon's own regular files block on nothing.
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_RDONLY))?;
        Ok(Opened::File(file, st))
    }

    /// Reads the whole of `name`, a regular file of at most `cap` bytes,
    /// with the file's `fstat`; `Ok(None)` when nothing is there. What
    /// sits at the name is looked at first and opened only if it is a
    /// regular file, then opened non-blocking without following a link
    /// and checked again: a FIFO, a device or a directory is
    /// [`SmallReadError::NotRegular`], a file over `cap` bytes (a sparse
    /// one included) is [`SmallReadError::TooLarge`], and at most `cap`
    /// bytes are ever read, however the file grows meanwhile. Every small
    /// file a reader takes from a shared directory (index headers, state,
    /// positions, metadata, cursors) comes through here.
    pub fn read_small(
        &self,
        name: impl AsRef<OsStr>,
        cap: u64,
    ) -> Result<Option<(Vec<u8>, FileStat)>, SmallReadError> {
        use std::io::Read;
        let name = name.as_ref();
        let shown = || name.to_string_lossy().into_owned();
        let io_err = |source: io::Error| SmallReadError::Io {
            name: shown(),
            source,
        };
        let not_regular = |st: &FileStat| SmallReadError::NotRegular {
            name: shown(),
            kind: kind_of(st),
        };
        match self.stat(name).map_err(io_err)? {
            None => return Ok(None),
            Some(st) if !is_type(&st, SFlag::S_IFREG) => return Err(not_regular(&st)),
            Some(_) => {}
        }
        let file = match self.open_at(name, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty()) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(e)),
        };
        let st = nix::sys::stat::fstat(&file).map_err(|e| io_err(e.into()))?;
        if !is_type(&st, SFlag::S_IFREG) {
            return Err(not_regular(&st));
        }
        let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
        if size > cap {
            return Err(SmallReadError::TooLarge {
                name: shown(),
                size,
                cap,
            });
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        file.take(cap).read_to_end(&mut bytes).map_err(io_err)?;
        Ok(Some((bytes, st)))
    }

    /// Whether the directory itself was removed (no link left).
    pub fn is_deleted(&self) -> bool {
        nix::sys::stat::fstat(&self.fd).is_ok_and(|st| st.st_nlink == 0)
    }

    /// Recreates a deleted directory through the parent descriptor held
    /// since [`Dir::open`] (`mkdirat`, then `openat(O_NOFOLLOW |
    /// O_DIRECTORY)`), with mode 01755 (sticky, as logmon makes the
    /// directories it owns), and returns the new handle. Refuses a result
    /// that is not a directory owned by our euid (a symlink or a directory
    /// the task made in the meantime).
    pub fn recreate(&self) -> io::Result<Dir> {
        let Some((parent, name)) = &self.parent else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the directory has no parent to recreate it in",
            ));
        };
        match nix::sys::stat::mkdirat(
            parent.as_fd(),
            name.as_os_str(),
            Mode::from_bits_truncate(0o1755),
        ) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = nix::fcntl::openat(
            parent.as_fd(),
            name.as_os_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let st = nix::sys::stat::fstat(&fd)?;
        if st.st_uid != nix::unistd::geteuid().as_raw() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} was recreated by uid {}, not by logmon",
                    self.path.display(),
                    st.st_uid
                ),
            ));
        }
        Ok(Dir {
            fd,
            path: self.path.clone(),
            id: FileId::of(&st),
            parent: Some((parent.clone(), name.clone())),
            deletion_noticed: AtomicBool::new(false),
        })
    }
}

/// This process's effective uid, asked once (logmon never changes it; a
/// busy shipper would otherwise ask at every look at a file).
fn euid() -> u32 {
    static EUID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EUID.get_or_init(|| nix::unistd::geteuid().as_raw())
}

/// The environment variable naming the uids, besides logmon's own, that
/// may own a directory logmon writes in (the log directory, a FIFO's
/// directory): `LOGMON_ACCEPT_DIR_OWNER=1000` or `=1000,1001`. For a task
/// that owns its log directory, accepted explicitly by the operator;
/// without it such a directory is refused ([`LogDirError::Foreign`]).
pub const ACCEPT_DIR_OWNER_ENV: &str = "LOGMON_ACCEPT_DIR_OWNER";

/// How many symlinks one [`Dir::open`] follows (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Whether `uid` is trusted to write where logmon resolves a path: root or
/// logmon's own uid.
fn trusted_writer(uid: u32) -> bool {
    uid == 0 || uid == euid()
}

/// Why someone other than root and logmon could have planted the entry
/// `entry` (an `lstat`) in the directory `dir` (an `fstat`), or `None`:
/// the directory belongs to another user; or others may write in it and
/// it is not sticky, or it is sticky and the entry is not a trusted
/// user's; or the entry itself belongs to another user.
fn plantable_by_others(dir: &FileStat, entry: &FileStat) -> Option<String> {
    if !trusted_writer(dir.st_uid) {
        return Some(format!("its directory belongs to uid {}", dir.st_uid));
    }
    let others_write = dir.st_mode & 0o022 != 0;
    let sticky = dir.st_mode & Mode::S_ISVTX.bits() != 0;
    if others_write && !(sticky && trusted_writer(entry.st_uid)) {
        return Some(format!(
            "its directory (mode {:o}) is writable by other users",
            dir.st_mode & 0o7777
        ));
    }
    if !trusted_writer(entry.st_uid) {
        return Some(format!("it belongs to uid {}", entry.st_uid));
    }
    None
}

/// The operator's path resolved one component at a time from `/`
/// (`fstatat` without following, then `openat(O_NOFOLLOW)`), following a
/// symlink only where no user but root and logmon could have planted it
/// ([`plantable_by_others`]): a link a task made in a directory it can
/// write (`alloc/logs -> /etc/cron.d`) is refused, naming it. Returns the
/// directory opened for reading and its parent (`O_PATH`) with its name.
fn resolve_dir(path: &Path) -> io::Result<(OwnedFd, Option<(OwnedFd, OsString)>)> {
    let root = |access: OFlag| {
        nix::fcntl::open(
            "/",
            access | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    };
    let mut todo = parts(path);
    let mut cur = root(OFlag::O_PATH)?;
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        let st = nix::sys::stat::fstatat(
            &cur,
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        if is_type(&st, SFlag::S_IFLNK) {
            links += 1;
            if links > MAX_LINKS {
                return Err(Errno::ELOOP.into());
            }
            let target = link_target(&cur, &name, &st, path)?;
            if target.is_absolute() {
                cur = root(OFlag::O_PATH)?;
            }
            for part in parts(&target).into_iter().rev() {
                todo.push_front(part);
            }
            continue;
        }
        let last = todo.is_empty();
        let access = if last { OFlag::O_RDONLY } else { OFlag::O_PATH };
        let next = nix::fcntl::openat(
            &cur,
            name.as_os_str(),
            access | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        if last {
            let parent = (name != "..").then_some((cur, name));
            return Ok((next, parent));
        }
        cur = next;
    }
    // `/` itself, or a link to it.
    let fd = nix::fcntl::openat(
        &cur,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    Ok((fd, None))
}

/// The components of `path` to resolve, `..` kept (resolved by the
/// kernel against the directory reached), `/` and `.` left out.
fn parts(path: &Path) -> std::collections::VecDeque<OsString> {
    use std::path::Component;
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// The target of the symlink `name` (its `lstat` is `st`) in the
/// directory `cur`, if only root or logmon could have planted it there;
/// refused naming it otherwise (`path` is the operator's, for the message).
fn link_target(cur: &OwnedFd, name: &OsStr, st: &FileStat, path: &Path) -> io::Result<PathBuf> {
    let dir_st = nix::sys::stat::fstat(cur)?;
    if let Some(why) = plantable_by_others(&dir_st, st) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is a symlink another user could have planted ({why}): refusing to follow it; name the real directory",
                path_so_far(path, name).display()
            ),
        ));
    }
    Ok(PathBuf::from(nix::fcntl::readlinkat(cur, name)?))
}

/// `path` up to and including its first component `name`, for a message
/// naming the refused link (the whole path when `name` came from a link's
/// target).
fn path_so_far(path: &Path, name: &OsStr) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        out.push(c);
        if c.as_os_str() == name {
            return out;
        }
    }
    path.to_path_buf()
}

/// The uids `LOGMON_ACCEPT_DIR_OWNER` names ([`ACCEPT_DIR_OWNER_ENV`]);
/// a value that is not a list of numbers accepts nobody.
fn accepted_owners() -> Vec<u32> {
    owners_accepted_in(std::env::var(ACCEPT_DIR_OWNER_ENV).ok().as_deref())
}

/// The uids a `LOGMON_ACCEPT_DIR_OWNER` value names.
fn owners_accepted_in(value: Option<&str>) -> Vec<u32> {
    value
        .map(|v| {
            v.split(',')
                .map(|u| u.trim().parse::<u32>())
                .collect::<Result<Vec<_>, _>>()
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// What a reader may believe about the names in a directory a task
/// shares (docs/design.md §9): who owns it, and whether others can rename or
/// remove names in it. Taken from an `fstat` of the directory's
/// descriptor ([`Dir::trust`]), so it describes the directory opened, not
/// whatever its path names now.
///
/// The one trust rule of logmon's readers, shipper, `ls` and agent
/// ([`Trust::not_logmons`], [`Dir::open_trusted`]): a name holds a file
/// logmon made when it is of the kind expected there (a regular file with
/// one link, a FIFO, a socket) and owned by root or by the reader's own
/// uid — never "the directory's owner", which is the task where a task
/// owns its log directory. Where names may have been renamed by someone
/// else ([`Trust::renamable_by_others`]: a directory of another owner, or
/// one others may write without the sticky bit), a name says nothing
/// about whose file it is, so no identity (task name, metadata, shipper
/// position) is taken from it.
/// Tests: `trust_rules_out_foreign_files_and_renamable_directories` below;
/// `tests/it/daemon/hostile.rs` through the readers and the shipper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trust {
    owner: u32,
    mode: u32,
    euid: u32,
}

/// What a name in a log directory should hold, for [`Trust::not_logmons`]
/// and [`Dir::open_trusted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A stream's log file: regular, one link (none once purged after a
    /// reader opened it: still logmon's, read to its end).
    Log,
    /// Any other regular file logmon writes (index, meta, positions,
    /// state): regular, one link.
    Regular,
    /// A FIFO.
    Fifo,
    /// The control socket.
    Socket,
}

impl Trust {
    /// The trust a directory of this `fstat` gives.
    pub fn of(st: &FileStat) -> Trust {
        Trust {
            owner: st.st_uid,
            mode: st.st_mode,
            euid: euid(),
        }
    }

    /// The directory's owner.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Whether the sticky bit is set.
    pub fn sticky(&self) -> bool {
        self.mode & Mode::S_ISVTX.bits() != 0
    }

    /// Whether `uid` may have made a file logmon trusts: root or this
    /// process's own uid (never the directory's owner).
    pub fn trusted_uid(&self, uid: u32) -> bool {
        uid == 0 || uid == self.euid
    }

    /// Why users other than root and this process could rename or remove
    /// other users' names in the directory, or `None` when they cannot:
    /// it belongs to another user (its owner may rename anything in it,
    /// sticky or not), or others may write in it and it is not sticky.
    pub fn renamable_by_others(&self) -> Option<&'static str> {
        if !self.trusted_uid(self.owner) {
            return Some("it belongs to another user, who can rename any name in it");
        }
        let others_write = self.mode & 0o022 != 0;
        (others_write && !self.sticky())
            .then_some("it is writable by others and has no sticky bit (chmod +t)")
    }

    /// The trust rule: why `st` (an `lstat` through the handle, or an
    /// `fstat` of what was opened), found at a name that should hold a
    /// `kind`, is not a file logmon made, or `None` when it is (see the
    /// type's docs).
    pub fn not_logmons(&self, st: &FileStat, kind: Kind) -> Option<String> {
        let want = match kind {
            Kind::Log | Kind::Regular => SFlag::S_IFREG,
            Kind::Fifo => SFlag::S_IFIFO,
            Kind::Socket => SFlag::S_IFSOCK,
        };
        if !is_type(st, want) {
            return Some(format!("a {}", kind_of(st)));
        }
        let links_ok = match kind {
            Kind::Log => st.st_nlink <= 1,
            Kind::Regular => st.st_nlink == 1,
            Kind::Fifo | Kind::Socket => true,
        };
        if !links_ok {
            return Some(format!("a {} with {} links", kind_of(st), st.st_nlink));
        }
        if !self.trusted_uid(st.st_uid) {
            let what = match kind {
                Kind::Log | Kind::Regular => "file",
                Kind::Fifo | Kind::Socket => kind_of(st),
            };
            return Some(format!(
                "a {what} of uid {} (neither root nor uid {})",
                st.st_uid, self.euid
            ));
        }
        None
    }

    /// [`Trust::not_logmons`] of a regular file with one link
    /// ([`Kind::Regular`]).
    pub fn foreign_file(&self, st: &FileStat) -> Option<String> {
        self.not_logmons(st, Kind::Regular)
    }
}

/// The outcome of [`Dir::open_trusted`].
#[derive(Debug)]
pub enum Opened {
    /// logmon's file, open read-only (blocking reads), and its `fstat`.
    File(File, FileStat),
    /// Nothing at the name (any more).
    Gone,
    /// Something logmon did not make: never read. Says what.
    Foreign(String),
}

/// Why a small file of a shared directory was not read
/// ([`Dir::read_small`]).
#[derive(Debug, thiserror::Error)]
pub enum SmallReadError {
    /// Something other than a regular file sits at the name (never
    /// opened: a FIFO would hang, a device could act).
    #[error("{name} is a {kind}, not a regular file")]
    NotRegular {
        /// The name.
        name: String,
        /// What it is.
        kind: &'static str,
    },
    /// Larger than the caller's cap (a sparse file included): not read.
    #[error("{name} holds {size} bytes, more than the {cap} a file of its kind may")]
    TooLarge {
        /// The name.
        name: String,
        /// Its size.
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// The OS refused (permissions, I/O, a symlink at the name).
    #[error("{name}: {source}")]
    Io {
        /// The name.
        name: String,
        /// The OS error.
        source: io::Error,
    },
}

/// Checks that `name` is one path component (no `/`, not `.`/`..`, not
/// empty): a [`Dir`] never resolves more than one name.
fn one_component(name: &OsStr) -> io::Result<&OsStr> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single file name"),
        ));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    fn wr() -> OFlag {
        OFlag::O_WRONLY
    }

    #[test]
    fn trust_rules_out_foreign_files_and_renamable_directories() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let t = dir.trust().unwrap();
        assert!(t.renamable_by_others().is_some());
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let t = dir.trust().unwrap();
        assert!(t.sticky() && t.renamable_by_others().is_none());
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(dir.trust().unwrap().renamable_by_others().is_none());
        std::fs::write(d.path().join("own"), b"x").unwrap();
        let st = dir.stat("own").unwrap().unwrap();
        assert_eq!(t.foreign_file(&st), None);
        std::fs::hard_link(d.path().join("own"), d.path().join("link")).unwrap();
        let st = dir.stat("own").unwrap().unwrap();
        assert!(t.foreign_file(&st).unwrap().contains("with 2 links"));
        // A stream's log file may have no link left (purged after it was
        // opened); a FIFO or a socket at a name is judged as such.
        let held = File::open(d.path().join("link")).unwrap();
        std::fs::remove_file(d.path().join("link")).unwrap();
        std::fs::remove_file(d.path().join("own")).unwrap();
        let gone = nix::sys::stat::fstat(&held).unwrap();
        assert_eq!(t.not_logmons(&gone, Kind::Log), None);
        assert!(t.not_logmons(&gone, Kind::Regular).is_some());
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let st = dir.stat("fifo").unwrap().unwrap();
        assert_eq!(t.not_logmons(&st, Kind::Fifo), None);
        assert_eq!(t.not_logmons(&st, Kind::Log).as_deref(), Some("a FIFO"));
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let st = dir.stat("sub").unwrap().unwrap();
        assert_eq!(t.foreign_file(&st).as_deref(), Some("a directory"));
        if nix::unistd::geteuid().is_root() {
            std::fs::write(d.path().join("theirs"), b"x").unwrap();
            std::os::unix::fs::chown(d.path().join("theirs"), Some(65534), None).unwrap();
            let st = dir.stat("theirs").unwrap().unwrap();
            assert!(t.foreign_file(&st).unwrap().contains("uid 65534"));
            // The directory's owner is not trusted: a task that owns its
            // log directory may rename anything in it, and its files are
            // its own, sticky bit or not.
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1755)).unwrap();
            std::os::unix::fs::chown(d.path(), Some(65534), None).unwrap();
            let t = dir.trust().unwrap();
            assert!(t.renamable_by_others().is_some());
            assert!(t.foreign_file(&st).unwrap().contains("uid 65534"));
            assert!(!t.trusted_uid(65534) && t.trusted_uid(0));
        }
    }

    #[test]
    fn replace_is_atomic_and_never_writes_through_a_planted_name() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let dir = Dir::open(&logs).unwrap();
        dir.replace("state", b"one").unwrap();
        assert_eq!(std::fs::read(logs.join("state")).unwrap(), b"one");
        // A link planted at the temp name and at the name: neither is
        // written through.
        let tmp = format!(".state.tmp.{}", std::process::id());
        symlink(&victim, logs.join(&tmp)).unwrap();
        std::fs::remove_file(logs.join("state")).unwrap();
        symlink(&victim, logs.join("state")).unwrap();
        dir.replace("state", b"two").unwrap();
        assert_eq!(std::fs::read(logs.join("state")).unwrap(), b"two");
        let m = std::fs::symlink_metadata(logs.join("state")).unwrap();
        assert!(m.is_file() && m.mode() & 0o777 == 0o600);
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        assert_eq!(dir.list().unwrap(), vec![OsString::from("state")]);
    }

    #[test]
    fn open_trusted_opens_only_what_logmon_made() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let t = dir.trust().unwrap();
        std::fs::write(d.path().join("ok"), b"fine").unwrap();
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        symlink(d.path().join("ok"), d.path().join("link")).unwrap();
        let Opened::File(mut f, st) = dir.open_trusted(&t, "ok", Kind::Log).unwrap() else {
            panic!("ok")
        };
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!((s.as_str(), st.st_size), ("fine", 4));
        for (name, why) in [("fifo", "a FIFO"), ("link", "a symlink")] {
            match dir.open_trusted(&t, name, Kind::Regular).unwrap() {
                Opened::Foreign(w) => assert_eq!(w, why),
                other => panic!("{name}: {other:?}"),
            }
        }
        assert!(matches!(
            dir.open_trusted(&t, "none", Kind::Log).unwrap(),
            Opened::Gone
        ));
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(d.path().join("ok"), Some(65534), None).unwrap();
            assert!(matches!(
                dir.open_trusted(&t, "ok", Kind::Log).unwrap(),
                Opened::Foreign(w) if w.contains("uid 65534")
            ));
        }
    }

    #[test]
    fn read_small_reads_only_small_regular_files_and_never_hangs() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        assert!(dir.read_small("none", 64).unwrap().is_none());
        std::fs::write(d.path().join("small"), b"12 34\n").unwrap();
        let (b, st) = dir.read_small("small", 64).unwrap().unwrap();
        assert_eq!((b.as_slice(), st.st_size), (&b"12 34\n"[..], 6));
        // Sparse and huge: refused from its size, nothing read.
        let f = std::fs::File::create(d.path().join("sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        assert!(matches!(
            dir.read_small("sparse", 64),
            Err(SmallReadError::TooLarge { size, .. }) if size == 1 << 40
        ));
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(
            dir.read_small("fifo", 64),
            Err(SmallReadError::NotRegular { kind: "FIFO", .. })
        ));
        symlink(d.path().join("small"), d.path().join("link")).unwrap();
        assert!(matches!(
            dir.read_small("link", 64),
            Err(SmallReadError::NotRegular {
                kind: "symlink",
                ..
            })
        ));
    }

    #[test]
    fn a_symlink_is_never_followed() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        symlink(&victim, logs.join("link")).unwrap();
        let dir = Dir::open(&logs).unwrap();
        assert!(dir.open_at("link", OFlag::O_RDONLY, Mode::empty()).is_err());
        assert!(dir
            .open_at("../victim", OFlag::O_RDONLY, Mode::empty())
            .is_err());
        assert!(dir.open_own("link", OFlag::O_RDONLY).unwrap().is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
    }

    #[test]
    fn a_planted_symlink_on_the_path_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let private = d.path().join("private");
        std::fs::create_dir(&private).unwrap();
        // The reference's alloc/: writable by the task, not sticky.
        let alloc = d.path().join("alloc");
        std::fs::create_dir(&alloc).unwrap();
        std::fs::set_permissions(&alloc, std::fs::Permissions::from_mode(0o777)).unwrap();
        symlink(&private, alloc.join("logs")).unwrap();
        let e = Dir::open(&alloc.join("logs")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("alloc/logs is a symlink"), "{e}");
        // Deeper, through a link in the middle of the path, and relative.
        std::fs::create_dir(private.join("inner")).unwrap();
        std::fs::remove_file(alloc.join("logs")).unwrap();
        symlink("../private", alloc.join("logs")).unwrap();
        assert!(Dir::open(&alloc.join("logs/inner")).is_err());
        assert!(matches!(
            Dir::open_log_dir(&alloc.join("logs")),
            Err(LogDirError::Io { .. })
        ));
        // The same link where only logmon (and root) could have made it
        // is followed, and the handle is the target's.
        let fixed = d.path().join("fixed");
        std::fs::create_dir(&fixed).unwrap();
        symlink("../private", fixed.join("logs")).unwrap();
        let dir = Dir::open(&fixed.join("logs/inner")).unwrap();
        let st = std::fs::metadata(private.join("inner")).unwrap();
        assert_eq!(
            dir.id(),
            FileId {
                dev: st.dev(),
                ino: st.ino()
            }
        );
        // Sticky and others may write: a link of logmon's own is followed.
        std::fs::set_permissions(&fixed, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(Dir::open(&fixed.join("logs")).is_ok());
        // A plain directory in a writable one is opened (it is checked by
        // owner where logmon writes, not refused).
        std::fs::create_dir(alloc.join("real")).unwrap();
        assert!(Dir::open(&alloc.join("real")).is_ok());
    }

    #[test]
    fn a_directory_of_another_owner_is_refused_unless_accepted() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED: needs root (chown)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        assert!(Dir::open_owned(&logs).is_ok());
        std::os::unix::fs::chown(&logs, Some(65534), None).unwrap();
        match Dir::open_log_dir(&logs) {
            Err(e @ LogDirError::Foreign { owner: 65534, .. }) => {
                assert!(
                    e.to_string().contains("LOGMON_ACCEPT_DIR_OWNER=65534"),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Readers open it: they trust files, not the directory.
        assert!(Dir::open_log_dir_to_read(&logs).is_ok());
        assert_eq!(owners_accepted_in(Some("65534")), vec![65534]);
        assert_eq!(owners_accepted_in(Some("1, 65534")), vec![1, 65534]);
        assert!(owners_accepted_in(Some("65534,x")).is_empty());
        assert!(owners_accepted_in(None).is_empty());
    }

    #[test]
    fn a_planted_name_is_removed_and_never_written_through() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        symlink(&victim, logs.join("a")).unwrap();
        std::fs::hard_link(&victim, logs.join("b")).unwrap();
        nix::unistd::mkfifo(&logs.join("c"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::create_dir(logs.join("e")).unwrap();
        std::fs::create_dir(logs.join("full")).unwrap();
        std::fs::write(logs.join("full/x"), b"x").unwrap();
        let dir = Dir::open(&logs).unwrap();
        for (name, kind) in [
            ("a", "symlink"),
            ("b", "regular file"),
            ("c", "FIFO"),
            ("e", "directory"),
        ] {
            match dir
                .create_own(name, wr(), Mode::from_bits_truncate(0o644))
                .unwrap()
            {
                Claim::Created { mut file, removed } => {
                    assert_eq!(removed, vec![kind.to_owned()], "{name}");
                    file.write_all(b"ours").unwrap();
                }
                Claim::Occupied { by, .. } => panic!("{name} occupied by {by}"),
            }
            assert_eq!(std::fs::read(logs.join(name)).unwrap(), b"ours");
        }
        assert!(matches!(
            dir.create_own("full", wr(), Mode::from_bits_truncate(0o644))
                .unwrap(),
            Claim::Occupied { .. }
        ));
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        assert_eq!(std::fs::metadata(&victim).unwrap().nlink(), 1);
    }

    #[test]
    fn open_own_refuses_foreign_files() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        std::fs::write(d.path().join("mine"), b"hello").unwrap();
        std::fs::write(d.path().join("other"), b"x").unwrap();
        std::fs::hard_link(d.path().join("other"), d.path().join("other2")).unwrap();
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let mut f = dir
            .open_own("mine", OFlag::O_RDONLY)
            .unwrap()
            .unwrap()
            .unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        assert!(dir
            .open_own("other", OFlag::O_RDONLY)
            .unwrap()
            .unwrap_err()
            .contains("hard link"));
        assert_eq!(
            dir.open_own("fifo", OFlag::O_RDONLY).unwrap().unwrap_err(),
            "FIFO"
        );
        assert!(dir
            .open_own("none", OFlag::O_RDONLY)
            .unwrap()
            .unwrap()
            .is_none());
    }

    #[test]
    fn names_with_a_slash_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        for bad in ["a/b", "..", ".", ""] {
            assert!(dir.stat(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_directory_renamed_away_is_still_the_one_used() {
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let dir = Dir::open(&logs).unwrap();
        std::fs::rename(&logs, d.path().join("moved")).unwrap();
        let other = d.path().join("elsewhere");
        std::fs::create_dir(&other).unwrap();
        symlink(&other, &logs).unwrap();
        match dir
            .create_own("f", wr(), Mode::from_bits_truncate(0o644))
            .unwrap()
        {
            Claim::Created { .. } => {}
            Claim::Occupied { by, .. } => panic!("{by}"),
        }
        assert!(d.path().join("moved/f").exists());
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
        assert_eq!(dir.list().unwrap(), vec![OsString::from("f")]);
    }

    #[test]
    fn make_sticky_adds_only_the_sticky_bit_and_says_why_not() {
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o2775)).unwrap();
        let dir = Dir::open(&logs).unwrap();
        assert!(!dir.trust().unwrap().sticky());
        dir.make_sticky().unwrap();
        let mode = std::fs::metadata(&logs).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o3775, "{mode:o}");
        assert!(dir.trust().unwrap().sticky());
        // Already sticky: nothing to do.
        dir.make_sticky().unwrap();
        if nix::unistd::geteuid().is_root() {
            // Another owner, as root: root may (CAP_FOWNER).
            std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o777)).unwrap();
            std::os::unix::fs::chown(&logs, Some(65534), None).unwrap();
            dir.make_sticky().unwrap();
            assert_eq!(std::fs::metadata(&logs).unwrap().mode() & 0o7777, 0o1777);
        } else {
            // Not ours and not root: refused, saying whose it is.
            let tmp = Dir::open(Path::new("/")).unwrap();
            if !tmp.trust().unwrap().sticky() {
                let e = tmp.make_sticky().unwrap_err();
                assert!(e.to_string().contains("owned by uid 0"), "{e}");
            }
        }
        // What sits at its name now, through the parent.
        assert!(dir
            .stat_at_name()
            .is_some_and(|st| is_type(&st, SFlag::S_IFDIR)));
        std::fs::remove_dir(&logs).unwrap();
        assert!(dir.stat_at_name().is_none());
        assert!(dir.first_notice_of_deletion());
        assert!(!dir.first_notice_of_deletion());
    }

    #[test]
    fn a_deleted_directory_is_recreated_through_its_parent() {
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let dir = Dir::open(&logs).unwrap();
        std::fs::remove_dir(&logs).unwrap();
        assert!(dir.is_deleted());
        let again = dir.recreate().unwrap();
        assert!(!again.is_deleted());
        assert!(logs.is_dir());
        assert!(again.trust().unwrap().sticky());
        // A symlink in its place is never followed.
        std::fs::remove_dir(&logs).unwrap();
        let other = d.path().join("elsewhere");
        std::fs::create_dir(&other).unwrap();
        symlink(&other, &logs).unwrap();
        assert!(again.recreate().is_err());
    }
}
