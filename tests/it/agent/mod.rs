//! The agent's side (`src/agent/`): `ensure`, reattach and its handshake,
//! the soak of an agent built on the hook, upgrades against the previous
//! release.

pub mod ensure;
mod handshake;
mod reattach;
mod soak;
mod upgrade;
