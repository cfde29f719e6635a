//! An overall deadline per logmon asked: a socket that answers slowly (a
//! frame header, then a byte every half second) passes every per-read
//! timeout, so each connection `ls` and the exporter open is registered
//! here with the instant its exchange must be over; one thread shuts the
//! connection down at that instant (`shutdown(2)` on a duplicate of its
//! descriptor), and the blocked read returns at once. A hostile socket so
//! costs its worker at most `--timeout` in all, and the other workers
//! answer the others meanwhile.
//!
//! Tests: the unit test below; `tests/it/node.rs`
//! (`a_trickling_fake_logmon_costs_at_most_the_timeout_in_all`).

use std::collections::BTreeMap;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections armed, by id: when to shut each down, a duplicate of it,
/// and the flag saying it was.
type Armed = BTreeMap<u64, (Instant, UnixStream, Arc<AtomicBool>)>;

#[derive(Default)]
struct Inner {
    next: u64,
    armed: Armed,
    done: bool,
}

type Shared = Arc<(Mutex<Inner>, Condvar)>;

/// The thread that shuts connections down at their deadlines; stopped
/// (and joined) when dropped.
pub struct Watchdog {
    shared: Shared,
    thread: Option<JoinHandle<()>>,
}

/// One connection's registration: dropping it disarms the deadline.
pub struct Guard {
    shared: Shared,
    id: u64,
    fired: Arc<AtomicBool>,
}

impl Guard {
    /// Whether the deadline passed and the connection was shut down.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut g = self.shared.0.lock().unwrap_or_else(|e| e.into_inner());
        g.armed.remove(&self.id);
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Inner> {
    shared.0.lock().unwrap_or_else(|e| e.into_inner())
}

impl Watchdog {
    /// Starts the thread.
    pub fn start() -> std::io::Result<Watchdog> {
        let shared: Shared = Arc::default();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ls-deadline".into())
            .spawn(move || watch(&s))?;
        Ok(Watchdog {
            shared,
            thread: Some(thread),
        })
    }

    /// Shuts `conn` (a duplicate is kept) down at `deadline`, unless the
    /// returned registration is dropped first.
    pub fn arm(&self, conn: &UnixStream, deadline: Instant) -> std::io::Result<Guard> {
        let dup = conn.try_clone()?;
        let fired = Arc::new(AtomicBool::new(false));
        let mut g = lock(&self.shared);
        let id = g.next;
        g.next += 1;
        g.armed.insert(id, (deadline, dup, fired.clone()));
        drop(g);
        self.shared.1.notify_one();
        Ok(Guard {
            shared: self.shared.clone(),
            id,
            fired,
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        lock(&self.shared).done = true;
        self.shared.1.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: shuts down what is due, sleeps until the next deadline.
fn watch(shared: &Shared) {
    let mut g = lock(shared);
    while !g.done {
        let now = Instant::now();
        for (at, conn, fired) in g.armed.values() {
            if *at <= now && !fired.swap(true, Ordering::AcqRel) {
                // Already closed by its reader: nothing to wake.
                let _ = conn.shutdown(Shutdown::Both);
            }
        }
        let next = g
            .armed
            .values()
            .filter(|(_, _, f)| !f.load(Ordering::Acquire))
            .map(|(at, _, _)| *at)
            .min();
        let wait = next.map_or(Duration::from_secs(3600), |at| {
            at.saturating_duration_since(now)
        });
        g = shared
            .1
            .wait_timeout(g, wait)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_blocked_read_returns_at_its_deadline_and_a_disarmed_one_is_left_alone() {
        let w = Watchdog::start().unwrap();
        let (mut a, _peer_a) = UnixStream::pair().unwrap();
        let (b, mut peer_b) = UnixStream::pair().unwrap();
        let t0 = Instant::now();
        let armed_a = w.arm(&a, t0 + Duration::from_millis(200)).unwrap();
        let armed_b = w.arm(&b, t0 + Duration::from_millis(100)).unwrap();
        drop(armed_b);
        let mut buf = [0u8; 1];
        // No one writes: only the shutdown ends this read.
        assert_eq!(a.read(&mut buf).unwrap(), 0);
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(armed_a.fired());
        // b was disarmed: still open, its peer sees no end.
        std::thread::sleep(Duration::from_millis(50));
        peer_b.set_nonblocking(true).unwrap();
        assert_eq!(
            peer_b.read(&mut buf).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    }
}
