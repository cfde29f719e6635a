//! Gives back the memory only start-up needed, once a daemon is ready
//! (per-instance memory with thousands of instances per node).
//!
//! Start-up (argument parsing, opening the files, building the sandbox's
//! filters) peaks at about 100 KiB of heap and 70 KiB of stack, while a
//! waiting daemon uses a fraction of either. Neither shrinks by itself:
//! glibc keeps freed heap pages resident unless they are at the top, and
//! stack pages stay resident once touched. So, right after the ready line
//! (not before: the agent waiting for it need not wait for this too):
//!
//! - `malloc_trim(0)` returns every whole free page of the heap to the
//!   kernel (glibc `madvise`s the free chunks in the middle, too);
//! - the stack below the current frame, minus a margin, is dropped with
//!   `MADV_DONTNEED`: those frames are dead (the daemon's own future and
//!   every live frame are above), and a page touched again later comes
//!   back zeroed, as a fresh stack page would.
//!
//! Nothing else changes: no allocation, limit or mapping. Proven by
//! `tests::released_stack_pages_read_back_as_zero_and_stay_usable` here;
//! the effect is measured by `benches/footprint.sh` (README, "Footprint").

use std::io;

/// Stack kept below the caller's frame: the red zone and the frames of the
/// calls this module makes. (Everything below the stack pointer is dead;
/// a larger margin would only keep pages the event loop may not need.)
const STACK_MARGIN: usize = 4 * 1024;

/// The largest stack considered when the limit is unlimited.
const STACK_SPAN_UNLIMITED: usize = 8 << 20;

/// Returns start-up's heap and stack pages to the kernel (module docs).
/// Errors are returned for logging only: the daemon works the same.
pub fn release_startup_memory() -> io::Result<()> {
    // SAFETY: malloc_trim only hands free heap memory back to the kernel;
    // no live allocation moves or changes.
    unsafe {
        nix::libc::malloc_trim(0);
    }
    release_stack_below_here()
}

/// Drops the resident pages of the main thread's stack more than
/// [`STACK_MARGIN`] below this function's frame. On another thread it does
/// nothing: only the main thread's stack is known to have nothing else
/// mapped below it.
#[inline(never)]
fn release_stack_below_here() -> io::Result<()> {
    if nix::unistd::gettid() != nix::unistd::getpid() {
        return Ok(());
    }
    let marker = 0u8;
    let here = std::hint::black_box(&marker) as *const u8 as usize;
    let top = here.saturating_sub(STACK_MARGIN);
    // The stack cannot reach further down than its limit, and the kernel
    // maps nothing else in that span (it keeps at least the limit free
    // below the stack for it to grow into; an unlimited stack puts every
    // other mapping far below, bottom up).
    let span = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_STACK)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|&s| s != nix::sys::resource::RLIM_INFINITY)
        .and_then(|s| usize::try_from(s).ok())
        .unwrap_or(STACK_SPAN_UNLIMITED);
    release_stack_between(top.saturating_sub(span), top)
}

fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .unwrap_or(4096)
}

/// `MADV_DONTNEED` over the whole pages in `[bottom, top)`, which must hold
/// no live object and nothing but this thread's stack.
fn release_stack_between(bottom: usize, top: usize) -> io::Result<()> {
    let page = page_size();
    let (bottom, top) = (bottom.next_multiple_of(page), top & !(page - 1));
    if bottom >= top {
        return Ok(());
    }
    // SAFETY: the caller guarantees [bottom, top) is dead stack of this
    // thread; MADV_DONTNEED on private anonymous memory only makes the
    // next touch see a zero page.
    let rc = unsafe {
        nix::libc::madvise(
            bottom as *mut nix::libc::c_void,
            top - bottom,
            nix::libc::MADV_DONTNEED,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    // ENOMEM: part of the span is not mapped (the gap below the stack);
    // the mapped part was released all the same.
    if e.raw_os_error() == Some(nix::libc::ENOMEM) {
        Ok(())
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Touches `depth` KiB of stack below the caller, returning a value
    /// that depends on all of it.
    #[inline(never)]
    fn deep(depth: usize) -> u64 {
        let mut buf = [0u8; 1024];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i as u8) ^ (depth as u8);
        }
        let here = std::hint::black_box(&mut buf)
            .iter()
            .map(|&b| u64::from(b))
            .sum::<u64>();
        if depth == 0 {
            here
        } else {
            here + deep(depth - 1)
        }
    }

    /// How many pages of `[lo, hi)` are resident (mincore).
    fn resident(lo: usize, hi: usize) -> usize {
        let page = page_size();
        let (lo, hi) = (lo.next_multiple_of(page), hi & !(page - 1));
        let mut v = vec![0u8; (hi - lo) / page];
        // SAFETY: mincore only writes one byte per page into `v`, which
        // has exactly that many.
        let rc =
            unsafe { nix::libc::mincore(lo as *mut nix::libc::c_void, hi - lo, v.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
        v.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn released_stack_pages_read_back_as_zero_and_stay_usable() {
        // A thread of its own with a 1 MiB stack: the pages released are
        // this test's alone.
        std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(|| {
                let marker = 0u8;
                let here = std::hint::black_box(&marker) as *const u8 as usize;
                let (lo, hi) = (here - 600 * 1024, here - STACK_MARGIN);
                let before = deep(300);
                let touched = resident(lo, hi);
                assert!(touched > 50, "the deep call touched {touched} pages");
                release_stack_between(lo, hi).expect("release");
                assert_eq!(resident(lo, hi), 0, "released pages are no longer resident");
                // The same deep call works again and computes the same.
                assert_eq!(deep(300), before);
                // The main-thread-only entry point leaves other threads alone.
                let again = resident(lo, hi);
                release_startup_memory().expect("release");
                assert_eq!(resident(lo, hi), again);
            })
            .expect("spawn")
            .join()
            .expect("the thread ends");
    }
}
