//! Write latency with and without the guard: a plain PUT versus a fenced
//! write (HEAD + conditional PUT), 4 KiB objects, median of 200 each, same
//! run. Always measures `InMemory`; with `--features s3` and `moto_server` on
//! PATH it also measures S3 via a moto server it starts on loopback, served
//! one request at a time (moto as shipped fails the construction probe: its
//! conditional PUT is not atomic).
//!
//! ```text
//! cargo run --release -p leasehold-object-store --features s3 --example bench_object_store
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::FencingToken;
use leasehold_object_store::object_store::memory::InMemory;
use leasehold_object_store::object_store::path::Path;
use leasehold_object_store::object_store::{ObjectStore, ObjectStoreExt};
use leasehold_object_store::FencedStore;

const WRITES: usize = 200;
const SIZE: usize = 4096;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let memory = FencedStore::new(Arc::new(InMemory::new()))?;
    report("InMemory", &memory)?;

    #[cfg(feature = "s3")]
    match leasehold_test_support::moto::MotoServer::start_serialized() {
        Ok(moto) => {
            let s3 = FencedStore::s3(s3_builder(&moto, "leasehold-bench")?)?;
            report("S3 (moto on loopback)", &s3)?;
        }
        Err(why) => println!("S3: skipped ({why})"),
    }
    #[cfg(not(feature = "s3"))]
    println!("S3: build with --features s3 to measure it");
    Ok(())
}

fn report(name: &str, fenced: &FencedStore) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let inner: Arc<dyn ObjectStore> = Arc::clone(fenced.inner());
    let content = bytes::Bytes::from(vec![b'x'; SIZE]);
    let token = FencingToken::new("bench", "bench", 1.into())?;
    let plain_path = Path::from("bench/plain");
    let fenced_path = Path::from("bench/fenced");

    // Warm up connections and create both objects.
    for _ in 0..10 {
        runtime.block_on(inner.put(&plain_path, content.clone().into()))?;
        fenced.write(&fenced_path, &token, content.clone())?;
    }
    let mut plain = Vec::with_capacity(WRITES);
    let mut guarded = Vec::with_capacity(WRITES);
    // Interleave so both see the same conditions.
    for _ in 0..WRITES {
        let start = Instant::now();
        runtime.block_on(inner.put(&plain_path, content.clone().into()))?;
        plain.push(start.elapsed());
        let start = Instant::now();
        fenced.write(&fenced_path, &token, content.clone())?;
        guarded.push(start.elapsed());
    }
    let (plain, guarded) = (median(plain), median(guarded));
    println!(
        "{name}: plain put median {plain:?}, fenced write median {guarded:?} \
         ({WRITES} writes of {SIZE} B each; overhead {:?}, x{:.2})",
        guarded.saturating_sub(plain),
        guarded.as_secs_f64() / plain.as_secs_f64().max(f64::MIN_POSITIVE)
    );
    Ok(())
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// A fenced-store builder for a fresh bucket on `moto`.
#[cfg(feature = "s3")]
fn s3_builder(
    moto: &leasehold_test_support::moto::MotoServer,
    bucket: &str,
) -> std::io::Result<leasehold_object_store::object_store::aws::AmazonS3Builder> {
    use leasehold_test_support::moto;
    moto.create_bucket(bucket)?;
    Ok(
        leasehold_object_store::object_store::aws::AmazonS3Builder::new()
            .with_endpoint(moto.endpoint())
            .with_allow_http(true)
            .with_bucket_name(bucket)
            .with_region(moto::REGION)
            .with_access_key_id(moto::ACCESS_KEY_ID)
            .with_secret_access_key(moto::SECRET_ACCESS_KEY),
    )
}
