//! A stalled lease holder wakes up after it was superseded, and the fenced
//! file itself refuses its write.
//!
//! No database needed: the tokens a lease grant would hand out are built
//! directly with `FencingToken::new`. Run with
//! `cargo run --example fenced_file`.

use leasehold::FencingToken;
use leasehold_fs::{FenceError, FencedFile};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("leasehold-fenced-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = FencedFile::create(dir.join("report.txt"), "nightly-report")?;
    println!(
        "file {} fenced by lease key \"nightly-report\"",
        file.path().display()
    );

    // t0: writer A acquires the lease and gets epoch 1 ...
    let a = FencingToken::new("nightly-report", "writer-a", leasehold::Epoch::from(1))?;
    println!("t0  A acquires the lease: {a}");
    // ... and stalls (GC pause, frozen VM) before writing. Its lease lapses.
    println!("t1  A pauses before writing; its lease expires");

    // t2: writer B acquires the lapsed lease: the epoch goes up to 2.
    let b = FencingToken::new("nightly-report", "writer-b", leasehold::Epoch::from(2))?;
    println!("t2  B acquires the lease: {b}");
    let record = file.write(&b, b"report by B\n")?;
    println!(
        "t3  B writes: accepted, file now at epoch {}",
        record.accepted_epoch
    );

    // t4: A wakes up, unaware, and tries to write with its old token.
    match file.write(&a, b"report by A (stale!)\n") {
        Err(FenceError::StaleEpoch {
            presented,
            accepted,
            ..
        }) => {
            println!(
                "t4  A wakes and writes with epoch {presented}: REFUSED (file accepted {accepted})"
            );
        }
        Ok(_) => return Err("the stale write was accepted; fencing is broken".into()),
        Err(other) => return Err(other.into()),
    }

    let (epoch, payload) = file.read()?;
    println!(
        "t5  file holds epoch {epoch}: {:?}",
        String::from_utf8_lossy(&payload)
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
