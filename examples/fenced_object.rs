//! A stalled writer is refused by the object itself.
//!
//! Writer A holds the lease at epoch 1 and "pauses" (think: a long GC pause)
//! just before writing. Meanwhile the lease passes to writer B at epoch 2,
//! which writes. When A wakes up, its write is refused with `StaleEpoch` and
//! B's data survives. Runs against an in-memory object store: no network, no
//! database (tokens are built by hand with `FencingToken::new`; in real use
//! they come from `Lease::token`).
//!
//! ```text
//! cargo run --example fenced_object
//! ```

use std::sync::Arc;

use leasehold::FencingToken;
use leasehold_object_store::object_store::{memory::InMemory, path::Path};
use leasehold_object_store::{FenceError, FencedStore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = FencedStore::new(Arc::new(InMemory::new()))?;
    let path = Path::from("reports/daily.csv");

    let token_a = FencingToken::new("daily-report", "writer-a", leasehold::Epoch::from(1))?;
    println!("t1  A acquires the lease: epoch {}", token_a.epoch());
    store.write(&path, &token_a, "day,total\nmon,10\n")?;
    println!("t2  A writes its first version; the object now accepts epoch >= 1");
    println!("t3  A pauses before its second write (GC pause, partition, ...)");

    let token_b = FencingToken::new("daily-report", "writer-b", leasehold::Epoch::from(2))?;
    println!(
        "t4  A's lease expires; B acquires it: epoch {}",
        token_b.epoch()
    );
    let receipt = store.write(&path, &token_b, "day,total\nmon,10\ntue,12\n")?;
    println!(
        "t5  B writes; the object now accepts epoch >= {}",
        receipt.state.epoch()
    );

    println!("t6  A wakes up and writes with its old token (epoch 1)");
    match store.write(&path, &token_a, "day,total\nmon,99\n") {
        Err(FenceError::StaleEpoch {
            presented,
            accepted,
            ..
        }) => println!("t7  refused: A presented epoch {presented}, object accepted {accepted}"),
        Err(other) => return Err(other.into()),
        Ok(_) => return Err("the stale write was accepted: fencing is broken".into()),
    }

    let object = store.read(&path)?;
    println!(
        "t8  object still holds B's data (epoch {}, written by {}):\n{}",
        object.state.epoch(),
        object.state.token.owner(),
        String::from_utf8_lossy(&object.content)
    );
    Ok(())
}
