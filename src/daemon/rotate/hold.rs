//! The shipper's hold (`run --keep-unshipped SIZE`, docs/design.md §12): purge
//! keeps up to SIZE bytes per stream of files the shipper has not
//! finished, read from its position beside the files. Tests:
//! `keep_unshipped_holds_a_stream_the_shipper_has_not_reached_up_to_size`
//! in `super::tests`.

use super::Rotator;
use crate::shared::layout::{file_name, zst_name};

impl Rotator {
    /// Holds purge for the node's shipper (`run --keep-unshipped SIZE`):
    /// up to `size` bytes of files beyond `max_files` that the shipper has
    /// not finished are kept. 0 (the default) keeps none. The daemon
    /// passes it to [`Rotator::open_in`] instead, so that the first purge
    /// holds too.
    pub fn set_keep_unshipped(&mut self, size: u64) {
        self.keep_unshipped = size;
    }

    /// Of the files about to be purged (`excess`, oldest first), those
    /// kept for the shipper: the ones at or after its position
    /// ([`crate::shared::shipped::load`], read here, at rotation only), newest
    /// first, as long as they add up to at most `keep_unshipped` bytes.
    /// The oldest unshipped go first when they do not all fit, so the kept
    /// files stay one contiguous run the shipper reads on from (what it
    /// cannot read it announces as a gap).
    ///
    /// Without a position the shipper is taken to be at the start: a
    /// stream it has not reached yet (no position file), whose position
    /// is unreadable, or whose position file could have been made or
    /// renamed by the task (`shipped::load` returns only a trusted one) is
    /// held like any unshipped stream. So a trusted position can only
    /// release the hold, a forged one can only keep it, and no order of
    /// kills opens a window where purge runs unheld: what is held costs
    /// at most `keep_unshipped` bytes of disk, never a line
    /// (`keep_unshipped_holds_a_stream_the_shipper_has_not_reached_up_to_size`).
    pub(super) fn held_for_shipper(&self, excess: &[u64]) -> Vec<u64> {
        if self.keep_unshipped == 0 || excess.is_empty() {
            return Vec::new();
        }
        let at = crate::shared::shipped::load(&self.dir, &self.task, self.stream);
        let from = at.map_or(0, |p| p.file);
        let mut held = Vec::new();
        let mut bytes = 0u64;
        for &n in excess.iter().rev().filter(|&&n| n >= from) {
            // The disk a file takes, plain or compressed.
            let size = [
                file_name(&self.task, self.stream, n),
                zst_name(&self.task, self.stream, n),
            ]
            .iter()
            .find_map(|name| match self.dir.stat(name) {
                Ok(Some(st)) => Some(u64::try_from(st.st_size).unwrap_or(u64::MAX)),
                _ => None,
            })
            .unwrap_or(0);
            if bytes.saturating_add(size) > self.keep_unshipped {
                break;
            }
            bytes += size;
            held.push(n);
        }
        if !held.is_empty() {
            tracing::debug!(stream = %self.stream, files = held.len(), bytes,
                shipped_to = ?at.map(|p| p.file), "purge held for the shipper");
        }
        held
    }
}
