//! What the chaos run's tasks write, as pure functions of the seed: each
//! task's profile (rate, bursts, long lines, partial lines, stderr share)
//! and the exact bytes of each line, so the writer and the checker agree
//! without sharing anything but the seed. A seeded RNG for the faults.

use logmon::config::Stream;

/// splitmix64: small, fast, and the same sequence for the same seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// A duration uniform in `lo_ms..=hi_ms` milliseconds.
    pub fn millis(&mut self, lo_ms: u64, hi_ms: u64) -> std::time::Duration {
        std::time::Duration::from_millis(self.range(lo_ms, hi_ms))
    }

    /// An exponentially distributed wait of mean `mean` (Poisson arrivals).
    pub fn exp(&mut self, mean: std::time::Duration) -> std::time::Duration {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        mean.mul_f64(-(1.0 - u).ln()).min(mean * 8)
    }
}

/// A hash of `parts` (through the RNG's mixer).
pub fn hash(parts: &[u64]) -> u64 {
    let mut r = Rng::new(0x6c6f_676d_6f6e);
    for p in parts {
        r.0 ^= *p;
        r.next();
    }
    r.next()
}

/// FNV-1a of a name.
pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How a task writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Steady lines per second (both streams together).
    pub rate: f64,
    /// Bursts: this many lines back to back, every so many milliseconds.
    pub burst: Option<(u64, u64)>,
    /// One line in this many is long (4 KB to 150 KB: larger than
    /// PIPE_BUF, some larger than a log file); 0: none.
    pub long_in: u64,
    /// One line in this many is written in two halves with a pause longer
    /// than logmon's partial-line wait in between; 0: none.
    pub partial_in: u64,
    /// One line in this many goes to stderr.
    pub err_in: u64,
}

/// The shortest and longest ordinary line.
const SHORT: (u64, u64) = (40, 200);
/// The shortest and longest long line: past PIPE_BUF, up to more than
/// two 64 KiB log files.
const LONG: (u64, u64) = (4_500, 150_000);

impl Profile {
    /// Task `task`'s profile under `seed`: about 30 % at 50 lines/s, 15 %
    /// at 200, 5 % at 1,000, 15 % bursty (a few lines a second and bursts
    /// of up to 10,000), the rest trickling (0.2 to 5 a second). A tenth
    /// of the tasks write long lines, a tenth of the trickling ones
    /// partial lines.
    pub fn of(seed: u64, task: &str) -> Profile {
        let h = hash(&[seed, hash_str(task)]);
        let mut r = Rng::new(h);
        let class = r.below(100);
        let (rate, burst) = match class {
            0..=29 => (50.0, None),
            30..=44 => (200.0, None),
            45..=49 => (1000.0, None),
            50..=64 => (
                r.range(1, 10) as f64,
                Some((r.range(500, 10_000), r.range(10_000, 40_000))),
            ),
            _ => (r.range(2, 50) as f64 / 10.0, None),
        };
        let long_in = if rate <= 200.0 && r.below(10) == 0 {
            r.range(200, 2000)
        } else {
            0
        };
        let partial_in = if rate <= 5.0 && burst.is_none() && r.below(10) < 3 {
            r.range(3, 20)
        } else {
            0
        };
        Profile {
            rate,
            burst,
            long_in,
            partial_in,
            err_in: r.range(3, 20),
        }
    }
}

/// What kind of line a line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Short,
    /// Longer than PIPE_BUF (written in more than one piece by the pipe).
    Long,
    /// Written in two halves with a pause between.
    Partial,
}

/// The identity of one line: its task's stream, the task's generation
/// (one per task process: a restarted task is the next one) and its
/// number in that generation's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LineId {
    pub gen: u32,
    pub seq: u64,
}

/// One stream of one task, as the writer and the checker see it.
#[derive(Debug, Clone)]
pub struct Lines {
    pub seed: u64,
    pub task: String,
    pub stream: Stream,
    pub profile: Profile,
    task_hash: u64,
}

/// The letters of a line's filler.
const FILLER: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

impl Lines {
    pub fn new(seed: u64, task: &str, stream: Stream) -> Lines {
        Lines {
            seed,
            task: task.to_owned(),
            stream,
            profile: Profile::of(seed, task),
            task_hash: hash_str(task),
        }
    }

    fn h(&self, id: LineId) -> u64 {
        hash(&[
            self.seed,
            self.task_hash,
            self.stream as u64,
            u64::from(id.gen),
            id.seq,
        ])
    }

    /// The kind and length of line `id`.
    pub fn shape(&self, id: LineId) -> (Shape, u64) {
        let h = self.h(id);
        let mut r = Rng::new(h);
        let p = &self.profile;
        let shape = if p.long_in > 0 && r.below(p.long_in) == 0 {
            Shape::Long
        } else if p.partial_in > 0 && r.below(p.partial_in) == 0 {
            Shape::Partial
        } else {
            Shape::Short
        };
        let (lo, hi) = if shape == Shape::Long { LONG } else { SHORT };
        let len = r.range(lo, hi).max(self.header(id).len() as u64 + 2);
        (shape, len)
    }

    fn header(&self, id: LineId) -> String {
        let s = match self.stream {
            Stream::Stdout => 'o',
            Stream::Stderr => 'e',
        };
        format!("{} {s} g{} n{} ", self.task, id.gen, id.seq)
    }

    /// The bytes of line `id`, its newline included.
    pub fn line(&self, id: LineId) -> Vec<u8> {
        let (_, len) = self.shape(id);
        let mut b = self.header(id).into_bytes();
        let start = (self.h(id) % FILLER.len() as u64) as usize;
        let fill = len as usize - b.len() - 1;
        b.extend((0..fill).map(|i| FILLER[(start + i) % FILLER.len()]));
        b.push(b'\n');
        b
    }

    /// The id a line of this stream names in its header, if it is one.
    pub fn parse(&self, line: &[u8]) -> Option<LineId> {
        let mut it = line.splitn(5, |&c| c == b' ');
        let task = it.next()?;
        let s = it.next()?;
        let gen = it.next()?.strip_prefix(b"g")?;
        let seq = it.next()?.strip_prefix(b"n")?;
        it.next()?;
        let want = match self.stream {
            Stream::Stdout => b"o",
            Stream::Stderr => b"e",
        };
        if task != self.task.as_bytes() || s != want {
            return None;
        }
        Some(LineId {
            gen: std::str::from_utf8(gen).ok()?.parse().ok()?,
            seq: std::str::from_utf8(seq).ok()?.parse().ok()?,
        })
    }
}

/// Whether line number `k` (counting both streams) of generation `gen`
/// goes to stderr.
pub fn to_stderr(seed: u64, task: &str, gen: u32, k: u64, p: &Profile) -> bool {
    hash(&[seed, hash_str(task), u64::from(gen), k, 0xe]).is_multiple_of(p.err_in.max(1))
}

/// `logmon: dropped N bytes`, the marker logmon writes after a write
/// error dropped bytes: N.
pub fn marker(line: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(b"logmon: dropped ")?;
    let rest = rest.strip_suffix(b" bytes\n")?;
    std::str::from_utf8(rest).ok()?.parse().ok()
}
