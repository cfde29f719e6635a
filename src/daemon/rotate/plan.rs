//! Planning (docs/design.md §1): how many of the waiting bytes go into the
//! active file, whether it rotates first, or whether a partial line waits
//! for its newline — a pure function of sizes and what was peeked, so the
//! rule is tested without files (`plan_*` in `super::tests`) and as
//! properties (`tests/it/daemon/rotation_props.rs`).

/// What to do next with the bytes waiting in the pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Move this many bytes into the active file.
    Write(usize),
    /// Close the active file; the next bytes go to index N+1.
    Rotate,
    /// Leave the bytes in the pipe: they are a partial line that may still
    /// get its newline.
    Hold,
}

/// Decides the next step for `avail` waiting bytes (`avail > 0`).
///
/// `size` is the active file's size and `limit` the maximum file size.
/// `peeked` is how many of the waiting bytes were looked at (at most
/// `min(avail, limit - size)`) and `last_nl` the offset of the last `\n`
/// among them. `flush_partial` says a partial line may not be held back any
/// longer (it waited 1 s, the pipe is full, or logmon is stopping).
/// `at_line_start` says the active file ends with a newline (or is empty):
/// otherwise the waiting bytes continue a line begun in it.
///
/// A file ends early only because the next *whole* line does not fit: a
/// line already begun in the file fills it first (docs/design.md §1; a file
/// left mid-line by a logmon killed between two splices of one piece is
/// resumed that way, `a_resumed_file_ending_mid_line_is_filled_before_the_next`).
pub fn plan(
    size: u64,
    limit: u64,
    avail: usize,
    peeked: usize,
    last_nl: Option<usize>,
    flush_partial: bool,
    at_line_start: bool,
) -> Step {
    let rem = limit.saturating_sub(size);
    if rem == 0 {
        return Step::Rotate;
    }
    if let Some(p) = last_nl {
        return Step::Write(p + 1);
    }
    let window = usize::try_from(rem).unwrap_or(usize::MAX).min(avail);
    if peeked < window {
        // Could not look far enough to decide; wait for the next pass.
        return if flush_partial {
            Step::Write(peeked.max(1).min(window))
        } else {
            Step::Hold
        };
    }
    if (avail as u64) > rem {
        // The next line does not fit in what is left of this file.
        if size > 0 && at_line_start {
            Step::Rotate
        } else {
            // A line longer than the limit, or one already begun here:
            // a piece that fills the file.
            Step::Write(window)
        }
    } else if flush_partial {
        Step::Write(avail)
    } else {
        Step::Hold
    }
}
