//! Write latency with and without the guard, in the same run.
//!
//! `plain`: the usual crash-safe replace, write temp + fsync + rename + fsync
//! directory, no lock, no check. `fenced`: `FencedFile::write` (lock, read and
//! check the header, then the same steps). Rounds alternate between the two
//! so disk state and noise hit both alike.
//!
//! Run: `cargo run --release -p leasehold-fs --example bench_fs [dir] [writes]`
//! (default dir: the system temp dir, which may be tmpfs where fsync is
//! free; pass a directory on the disk you care about).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasehold::FencingToken;
use leasehold_fs::FencedFile;

fn plain_write(dir: &Path, path: &Path, temp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(temp, path)?;
    File::open(dir)?.sync_all()
}

fn summary(name: &str, samples: &mut [Duration]) -> Duration {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:>7}: median {:>8.1} us   p10 {:>8.1} us   p90 {:>8.1} us   (n={})",
        at(0.5).as_secs_f64() * 1e6,
        at(0.1).as_secs_f64() * 1e6,
        at(0.9).as_secs_f64() * 1e6,
        samples.len()
    );
    at(0.5)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let base = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let writes: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(200);
    let dir = base.join(format!("lhfs-bench-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let payload = vec![0xA5u8; 4096];

    let plain_path = dir.join("plain");
    let plain_temp = dir.join(".plain.tmp");
    let fenced = FencedFile::new(dir.join("fenced"))?;
    let token = FencingToken::new("bench", "bench", 1.into())?;

    // Warm up both paths (file creation, directory entries, page cache).
    for _ in 0..10 {
        plain_write(&dir, &plain_path, &plain_temp, &payload)?;
        fenced.write(&token, &payload)?;
    }
    let (mut plain, mut guarded) = (Vec::with_capacity(writes), Vec::with_capacity(writes));
    for round in 0..writes {
        // Alternate which goes first, so neither always follows the other.
        for which in [round % 2, 1 - round % 2] {
            let start = Instant::now();
            if which == 0 {
                plain_write(&dir, &plain_path, &plain_temp, &payload)?;
                plain.push(start.elapsed());
            } else {
                fenced.write(&token, &payload)?;
                guarded.push(start.elapsed());
            }
        }
    }
    println!(
        "{writes} writes of {} bytes each in {}",
        payload.len(),
        dir.display()
    );
    let p = summary("plain", &mut plain);
    let f = summary("fenced", &mut guarded);
    println!(
        "overhead of the guard: {:+.1} us per write ({:+.1}%)",
        (f.as_secs_f64() - p.as_secs_f64()) * 1e6,
        (f.as_secs_f64() / p.as_secs_f64() - 1.0) * 100.0
    );
    fs::remove_dir_all(&dir)?;
    Ok(())
}
