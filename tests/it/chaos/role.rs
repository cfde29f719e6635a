//! The chaos run's own processes (the agent, the tasks) are its program
//! started again with `CHAOS_ROLE` and `CHAOS_ARGS` (JSON) in the
//! environment: the bench binary dispatches them from `main`, the test
//! binary from an ignored test it runs alone (`chaos::role`). `CHAOS_ROOT`
//! (the run's directory) marks every process of the run, so that none is
//! left behind.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The role variable.
pub const ROLE: &str = "CHAOS_ROLE";
/// The arguments variable (JSON).
pub const ARGS: &str = "CHAOS_ARGS";
/// The run directory variable: marks the run's processes.
pub const ROOT: &str = "CHAOS_ROOT";

/// How to start a role: this program, with these arguments first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Exe {
    pub program: PathBuf,
    pub prefix: Vec<String>,
}

impl Exe {
    /// A command that runs `role` with `args`, marked as a process of the
    /// run in `root`.
    pub fn command(&self, role: &str, args: &impl Serialize, root: &Path) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.prefix)
            .env(ROLE, role)
            .env(ARGS, serde_json::to_string(args).expect("role arguments"))
            .env(ROOT, root);
        c
    }
}

/// Runs the role named in the environment, if any, and exits with its
/// code; returns when none is named.
pub fn dispatch() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let args = std::env::var(ARGS).unwrap_or_default();
    let code = match role.as_str() {
        "task" => match serde_json::from_str(&args) {
            Ok(a) => super::task::main(a),
            Err(e) => bad(&role, e),
        },
        "agent" => match serde_json::from_str(&args) {
            Ok(a) => super::agent::main(a),
            Err(e) => bad(&role, e),
        },
        other => {
            eprintln!("chaos: unknown role {other:?}");
            2
        }
    };
    std::process::exit(code);
}

fn bad(role: &str, e: serde_json::Error) -> i32 {
    eprintln!("chaos {role}: bad {ARGS}: {e}");
    2
}
