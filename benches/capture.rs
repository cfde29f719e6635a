//! FIFO → rotated files throughput, in-process.
//!
//! A writer thread writes a stream of sequence-numbered 100-byte lines into
//! a FIFO through the task's end ([`fifo::open_task_end`]), either in 64 KiB
//! `write()`s (`bulk_64k`) or one `write()` per line (`line_100b`). On the
//! other side, in the same run and on the same data:
//!
//! - `read_write_copy` — the baseline: a plain blocking `read()`/`write()`
//!   loop (128 KiB buffer, like cat) from the FIFO into one file;
//! - `capture_drain` — [`StreamCapture::drain`] fed through [`PipeSource`]
//!   (tee to find newlines, splice into the files), one drain per wake-up of
//!   an edge-triggered epoll, no runtime and no batching: the state
//!   machine's own cost;
//! - `capture_pump` — the daemon's own pump, [`Pump`] driven by the
//!   daemon's event loop (`reactor::Poller`, SIGIO from a signalfd, with
//!   whatever batching it does, `--max-delay` at its default), stopped once
//!   the writer is done (it then drains the rest).
//!
//! Both keep the capture-time index, as the daemon always does.
//!
//! Every iteration gets a fresh log directory (rotation on: 4 MiB files, 4
//! kept); the FIFO is opened with [`fifo::open_reader_at`] (1 MiB pipe) for all
//! three. Timed: from the writer thread's start until every byte is in a
//! file. After each benchmark the consumer's and the writer's CPU time per
//! 10^9 bytes (thread CPU clocks) is printed, since the line-mode target is
//! about CPU, not only throughput.
//!
//! Environment: `LOGMON_BENCH_MIB` (stream size per iteration, default 64),
//! `LOGMON_BENCH_SECS` (measurement time per benchmark, default 10),
//! `LOGMON_BENCH_DIR` (where FIFOs and files go, default the temp dir: the
//! file system measured). `cargo bench --bench capture -- --quick` for a
//! short run.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use logmon::config::{Stream, TaskName, WriteErrorPolicy};
use logmon::internals::capture::{Drained, PipeSource, Pump, StreamCapture};
use logmon::internals::dir::Dir;
use logmon::internals::fifo;
use logmon::internals::reactor::{Interest, Poller};
use logmon::internals::rotate::Rotator;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::libc;

const LINE: usize = 100;
const BULK_WRITE: usize = 64 * 1024;
const PIPE_SIZE: u64 = 1 << 20;
const FILE_SIZE: u64 = 4 << 20;
const KEEP: u32 = 4;
const COPY_BUF: usize = 128 * 1024;

#[derive(Debug, Clone, Copy)]
enum Pattern {
    Bulk,
    Line,
}

impl Pattern {
    fn write_size(self) -> usize {
        match self {
            Pattern::Bulk => BULK_WRITE,
            Pattern::Line => LINE,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Pattern::Bulk => "bulk_64k",
            Pattern::Line => "line_100b",
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Lines `k = 0, 1, …`: 16 digits of k, a space, 82 × ('a' + k % 26), '\n'.
fn make_stream(bytes: usize) -> Vec<u8> {
    let lines = bytes / LINE;
    let mut v = Vec::with_capacity(lines * LINE);
    for k in 0..lines {
        let start = v.len();
        write!(v, "{k:016} ").expect("write to a Vec");
        v.resize(start + LINE - 1, b'a' + (k % 26) as u8);
        v.push(b'\n');
    }
    v
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The FIFO of one benchmark: logmon's reading end and the task's end.
struct Fifo {
    _dir: tempfile::TempDir,
    reader: OwnedFd,
    capacity: usize,
    task_end: File,
}

fn bench_root() -> PathBuf {
    std::env::var_os("LOGMON_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from)
}

fn open_fifo() -> Fifo {
    let dir = tempfile::Builder::new()
        .prefix("logmon-bench")
        .tempdir_in(bench_root())
        .expect("temp dir");
    let path = dir.path().join("stdout.fifo");
    let log_dir = Dir::open_owned(dir.path()).expect("open the FIFO's directory");
    let fifo::Reader {
        fd: reader,
        capacity,
        ..
    } = fifo::open_reader_at(&log_dir, "stdout.fifo".as_ref(), PIPE_SIZE).expect("open_reader_at");
    let task_end = fifo::open_task_end(&path).expect("open_task_end");
    Fifo {
        _dir: dir,
        reader,
        capacity,
        task_end,
    }
}

/// Writes `data` into the FIFO in `pattern`'s write size; returns the writer
/// thread's CPU time.
fn spawn_writer(
    fifo: &File,
    data: &Arc<Vec<u8>>,
    pattern: Pattern,
) -> thread::JoinHandle<Duration> {
    let mut f = fifo.try_clone().expect("dup the task end");
    let data = Arc::clone(data);
    thread::spawn(move || {
        let c0 = thread_cpu();
        for chunk in data.chunks(pattern.write_size()) {
            f.write_all(chunk).expect("write into the FIFO");
        }
        thread_cpu() - c0
    })
}

/// Edge-triggered epoll on one fd (nix's `event` feature is not enabled).
struct Epoll(OwnedFd);

impl Epoll {
    fn new(fd: BorrowedFd<'_>) -> io::Result<Self> {
        // SAFETY: epoll_create1 returns a new fd or -1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ep` is a fresh fd that nothing else owns.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: 0,
        };
        // SAFETY: both fds are open; `ev` is a valid epoll_event.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) }
            < 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(Epoll(ep))
    }

    fn wait(&self, timeout: Option<Duration>) -> io::Result<()> {
        let ms = timeout.map_or(-1, |d| {
            d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        });
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }];
        // SAFETY: `ev` has room for the one event asked for.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), ev.as_mut_ptr(), 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }
}

fn new_capture(dir: &std::path::Path) -> StreamCapture {
    let task = TaskName::new("bench").expect("task name");
    let dir = Arc::new(Dir::open_log_dir(dir).expect("log dir"));
    let rotator =
        Rotator::open_in(dir, &task, Stream::Stdout, KEEP, FILE_SIZE, 0, false).expect("rotator");
    StreamCapture::new(Stream::Stdout, rotator, WriteErrorPolicy::Drop)
}

/// One timed transfer: (wall time, consumer CPU, writer CPU).
struct Sample {
    wall: Duration,
    consumer: Duration,
    writer: Duration,
}

/// The baseline: blocking read()/write() from the FIFO into one file.
fn run_copy(fifo: &Fifo, data: &Arc<Vec<u8>>, pattern: Pattern, buf: &mut [u8]) -> Sample {
    let dir = tempfile::tempdir_in(bench_root()).expect("log dir");
    let mut out = File::create(dir.path().join("out")).expect("out file");
    let mut rd = File::from(fifo.reader.try_clone().expect("dup the reader"));
    let total = data.len();
    let c0 = thread_cpu();
    let t0 = Instant::now();
    let w = spawn_writer(&fifo.task_end, data, pattern);
    let mut done = 0;
    while done < total {
        let n = rd.read(buf).expect("read the FIFO");
        out.write_all(&buf[..n]).expect("write the file");
        done += n;
    }
    let writer = w.join().expect("writer thread");
    let wall = t0.elapsed();
    let consumer = thread_cpu() - c0;
    assert_eq!(out.metadata().expect("stat").len(), total as u64);
    Sample {
        wall,
        consumer,
        writer,
    }
}

/// StreamCapture::drain through PipeSource, woken by edge-triggered epoll.
fn run_drain(fifo: &Fifo, data: &Arc<Vec<u8>>, pattern: Pattern) -> Sample {
    let dir = tempfile::tempdir_in(bench_root()).expect("log dir");
    let mut capture = new_capture(dir.path());
    let mut peeker = logmon::internals::capture::pipe::Peeker::new(fifo.capacity).expect("peeker");
    let ep = Epoll::new(fifo.reader.as_fd()).expect("epoll");
    let total = data.len() as u64;
    let c0 = thread_cpu();
    let t0 = Instant::now();
    let w = spawn_writer(&fifo.task_end, data, pattern);
    loop {
        let now = Instant::now();
        let outcome = {
            let mut src = PipeSource::new(fifo.reader.as_fd(), fifo.capacity, &mut peeker);
            capture.drain(&mut src, now, false).expect("drain")
        };
        if capture.stats().bytes_captured >= total {
            break;
        }
        let timeout = match outcome {
            // What arrived during the pass is drained at once.
            Drained::More => continue,
            Drained::Empty => None,
            Drained::Held { deadline } => Some(deadline.saturating_duration_since(Instant::now())),
            Drained::Blocked { retry_at } => {
                Some(retry_at.saturating_duration_since(Instant::now()))
            }
        };
        ep.wait(timeout).expect("epoll_wait");
    }
    let writer = w.join().expect("writer thread");
    let wall = t0.elapsed();
    let consumer = thread_cpu() - c0;
    let stats = capture.stats();
    assert_eq!(stats.bytes_captured, total);
    assert!(stats.rotations > 0, "rotation must be exercised");
    Sample {
        wall,
        consumer,
        writer,
    }
}

/// The daemon's pump in the daemon's event loop: SIGIO blocked and read
/// from a signalfd, the pump advanced on it or at its deadline, and
/// finished once the writer is done (a socket pair says so).
fn run_pump(fifo: &Fifo, data: &Arc<Vec<u8>>, pattern: Pattern) -> Sample {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    const SIGIO: u64 = 0;
    const DONE: u64 = 1;
    let dir = tempfile::tempdir_in(bench_root()).expect("log dir");
    let capture = Rc::new(RefCell::new(new_capture(dir.path())));
    let reader = fifo.reader.try_clone().expect("dup the reader");
    let total = data.len() as u64;
    logmon::internals::capture::sigio::install_handler().expect("SIGIO handler");
    let mut set = SigSet::empty();
    set.add(Signal::SIGIO);
    set.thread_block().expect("block SIGIO");
    let sigfd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .expect("signalfd");
    let poller = Poller::new().expect("epoll");
    poller
        .add(&sigfd, SIGIO, Interest::Read)
        .expect("watch SIGIO");
    let (done_rx, done_tx) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    poller
        .add(&done_rx, DONE, Interest::Read)
        .expect("watch done");
    let c0 = thread_cpu();
    let t0 = Instant::now();
    let mut pump = Pump::new(
        reader,
        fifo.capacity,
        logmon::internals::capture::pipe::Peeker::new(fifo.capacity).expect("scratch pipe"),
        capture.clone(),
        logmon::config::DEFAULT_MAX_DELAY,
    )
    .expect("pump");
    let w = spawn_writer(&fifo.task_end, data, pattern);
    let notify = thread::spawn(move || {
        let cpu = w.join().expect("writer thread");
        (&done_tx).write_all(b"x").expect("say done");
        cpu
    });
    let (mut sigio, mut done) = (false, false);
    loop {
        pump.advance(Instant::now(), sigio).expect("pump");
        sigio = false;
        if done {
            break;
        }
        poller
            .wait(pump.deadline(), |r| match r.token {
                SIGIO => {
                    while let Ok(Some(_)) = sigfd.read_signal() {}
                    sigio = true;
                }
                _ => done = true,
            })
            .expect("wait");
    }
    pump.finish().expect("finish");
    let writer = notify.join().expect("notify thread");
    let wall = t0.elapsed();
    let consumer = thread_cpu() - c0;
    let stats = capture.borrow().stats();
    assert_eq!(stats.bytes_captured, total);
    assert!(stats.rotations > 0, "rotation must be exercised");
    Sample {
        wall,
        consumer,
        writer,
    }
}

#[derive(Default)]
struct Cpu {
    bytes: u64,
    consumer: Duration,
    writer: Duration,
}

impl Cpu {
    fn add(&mut self, s: &Sample, bytes: usize) -> Duration {
        self.bytes += bytes as u64;
        self.consumer += s.consumer;
        self.writer += s.writer;
        s.wall
    }
    fn report(&self, id: &str) {
        if self.bytes == 0 {
            return;
        }
        let gb = self.bytes as f64 / 1e9;
        println!(
            "{id}: consumer CPU {:.2} s/GB, writer CPU {:.2} s/GB ({:.0} MB moved, thread CPU clocks)",
            self.consumer.as_secs_f64() / gb,
            self.writer.as_secs_f64() / gb,
            self.bytes as f64 / 1e6
        );
    }
}

fn fifo_to_files(c: &mut Criterion) {
    let mib = env_u64("LOGMON_BENCH_MIB", 64).max(1) as usize;
    let secs = env_u64("LOGMON_BENCH_SECS", 10).max(1);
    let data = Arc::new(make_stream(mib << 20));
    let mut buf = vec![0u8; COPY_BUF];
    for pattern in [Pattern::Bulk, Pattern::Line] {
        let mut g = c.benchmark_group(format!("fifo_to_files/{}", pattern.name()));
        g.throughput(Throughput::Bytes(data.len() as u64))
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(secs));

        let fifo = open_fifo();
        // The baseline reads with blocking read(2), like cat.
        let flags = OFlag::from_bits_truncate(
            fcntl(fifo.reader.as_fd(), FcntlArg::F_GETFL).expect("F_GETFL"),
        );
        fcntl(
            fifo.reader.as_fd(),
            FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK),
        )
        .expect("F_SETFL");
        let mut cpu = Cpu::default();
        g.bench_function("read_write_copy", |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| cpu.add(&run_copy(&fifo, &data, pattern, &mut buf), data.len()))
                    .sum()
            })
        });
        cpu.report(&format!("fifo_to_files/{}/read_write_copy", pattern.name()));
        drop(fifo);

        let fifo = open_fifo();
        for (id, run) in [
            (
                "capture_drain",
                run_drain as fn(&Fifo, &Arc<Vec<u8>>, Pattern) -> Sample,
            ),
            ("capture_pump", run_pump),
        ] {
            let mut cpu = Cpu::default();
            g.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| cpu.add(&run(&fifo, &data, pattern), data.len()))
                        .sum()
                })
            });
            cpu.report(&format!("fifo_to_files/{}/{id}", pattern.name()));
        }
        g.finish();
    }
}

criterion_group!(benches, fifo_to_files);
criterion_main!(benches);
