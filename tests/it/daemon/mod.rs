//! The per-task daemon (`src/daemon/`), through the real binary: capture,
//! the control socket, the daemon's own binary, faults underneath it, a
//! hostile task against it and its files, rotation's properties, systemd.

mod capture;
mod compress;
mod containerd;
mod control;
mod daemon_binary;
mod faults;
mod hostile;
mod hostile_daemon;
mod hostile_layout;
mod rate_limit;
mod rotation_props;
mod systemd;
