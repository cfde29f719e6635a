//! What every side takes: the directory handle, the task's flags, the
//! names in a log directory (`layout`, their one formatter and parser)
//! and metadata, the wire protocol, the FIFOs' two ends, the capture-time index
//! format, the in-place counter files, the shipper's positions, process identity, the sandbox, the
//! signalfd, logmon's own diagnostics and the error helpers. Each module's
//! doc names its guarantees and the tests that prove them.

pub mod config;
pub mod counter;
pub mod diag;
pub mod dir;
pub mod error;
#[allow(unsafe_code)] // flock(2) on a borrowed fd
pub mod fifo;
pub mod index;
pub mod layout;
pub mod logfile;
pub mod meta;
#[allow(unsafe_code)] // pidfd_open, pidfd_send_signal
pub mod process;
pub mod protocol;
#[allow(unsafe_code)] // prctl, capset
pub mod sandbox;
pub mod shipped;
#[allow(unsafe_code)] // registering the signalfd with the runtime (logs, ship)
pub mod signals;
pub mod sockaddr;
pub mod time;
