//! What a killed compression (`run --compress`, `crate::daemon::compress`)
//! can leave, tidied at start (docs/design.md §16): a temporary name, or a
//! file N under both its names. With or without `--compress`, so a
//! restart without it leaves no stray name either. Tests: below, and
//! `tests/it/daemon/compress.rs::kill_9_during_compression_keeps_every_line_once_and_no_stray_name`.

use std::io;

use crate::shared::dir::Dir;
use crate::shared::layout::{file_name, parse_any, parse_zst_temp, zst_name, Stream, TaskName};

/// At start, whatever a killed compression left of `stream`: its
/// temporary names are removed, and where file N is there both plain and
/// compressed (killed between rename and unlink) the plain name goes (the
/// `.zst` is complete: it is renamed there only once synced). Returns how
/// many names it removed. Done with or without `--compress`.
///
/// `names` are the stream's names as just listed (`Dir::list_matching`
/// with `layout::of_stream`); the names it removes are taken out of
/// `names` too, so the caller's later steps (the first purge) go on from
/// the same listing.
pub fn tidy_listed(
    dir: &Dir,
    task: &TaskName,
    stream: Stream,
    names: &mut Vec<std::ffi::OsString>,
) -> io::Result<u64> {
    let mut plain = Vec::new();
    let mut packed = Vec::new();
    let mut gone: Vec<String> = Vec::new();
    for name in names.iter().filter_map(|n| n.to_str()) {
        if parse_zst_temp(name, task, stream).is_some() {
            dir.remove(name)?;
            gone.push(name.to_owned());
        } else if let Some((n, z)) = parse_any(name, task, stream) {
            if z { &mut packed } else { &mut plain }.push(n);
        }
    }
    for n in plain.into_iter().filter(|n| packed.contains(n)) {
        let own = |name: &str| matches!(dir.stat(name), Ok(Some(st)) if crate::shared::dir::foreign_reason(&st).is_none());
        if own(&zst_name(task, stream, n)) && own(&file_name(task, stream, n)) {
            dir.remove(file_name(task, stream, n))?;
            gone.push(file_name(task, stream, n));
        }
    }
    names.retain(|n| !n.to_str().is_some_and(|s| gone.iter().any(|g| g == s)));
    Ok(gone.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tidy(dir: &Dir, task: &TaskName, stream: Stream) -> io::Result<u64> {
        let mut names = dir.list_matching(|n| crate::shared::layout::of_stream(n, task, stream))?;
        tidy_listed(dir, task, stream, &mut names)
    }

    fn task() -> TaskName {
        TaskName::new("web").unwrap()
    }

    fn names(d: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn lines(n: u32) -> Vec<u8> {
        (0..n)
            .flat_map(|i| format!("GET /item/{i} 200\n").into_bytes())
            .collect()
    }

    /// Every state a kill -9 can leave: tidy keeps exactly one name per
    /// file N, the complete one, and no temporary name.
    #[test]
    fn tidy_after_a_kill_at_any_step_leaves_one_name_per_file() {
        let d = tempfile::tempdir().unwrap();
        let body = lines(1000);
        let z = zstd::encode_all(&body[..], 3).unwrap();
        // Killed while writing the temporary name (a partial frame).
        std::fs::write(d.path().join("web.stdout.1"), &body).unwrap();
        std::fs::write(d.path().join(".web.stdout.1.zst.tmp"), &z[..z.len() / 2]).unwrap();
        // Killed between the rename and the unlink.
        std::fs::write(d.path().join("web.stdout.2"), &body).unwrap();
        std::fs::write(d.path().join("web.stdout.2.zst"), &z).unwrap();
        // Done.
        std::fs::write(d.path().join("web.stdout.3.zst"), &z).unwrap();
        // The other stream untouched.
        std::fs::write(d.path().join(".web.stderr.1.zst.tmp"), b"x").unwrap();
        let dir = Dir::open(d.path()).unwrap();
        assert_eq!(tidy(&dir, &task(), Stream::Stdout).unwrap(), 2);
        assert_eq!(
            names(d.path()),
            [
                ".web.stderr.1.zst.tmp",
                "web.stdout.1",
                "web.stdout.2.zst",
                "web.stdout.3.zst"
            ]
        );
    }
}
