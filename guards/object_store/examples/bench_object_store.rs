//! Write latency with and without the guard: a plain PUT versus a fenced
//! write (HEAD + conditional PUT), 4 KiB objects, median of 200 each, same
//! run. Always measures `InMemory`; with `--features s3` and `moto_server` on
//! PATH it also measures S3 via a moto server it starts on loopback.
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
    match moto::start() {
        Some(moto) => {
            let s3 = FencedStore::s3(moto.builder()?)?;
            report("S3 (moto on loopback)", &s3)?;
        }
        None => println!("S3: moto_server not found (pip install 'moto[server]'), skipped"),
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
    let token = FencingToken::new("bench", "bench", 1)?;
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

#[cfg(feature = "s3")]
mod moto {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use leasehold_object_store::object_store::aws::AmazonS3Builder;

    pub struct Moto {
        child: Child,
        port: u16,
    }

    impl Drop for Moto {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    pub fn start() -> Option<Moto> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let moto = Moto { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while http(port, "GET", "/").is_err() {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(moto)
    }

    impl Moto {
        pub fn builder(&self) -> std::io::Result<AmazonS3Builder> {
            let status = http(self.port, "PUT", "/leasehold-bench")?;
            if !status.contains(" 200 ") {
                return Err(std::io::Error::other(format!("creating bucket: {status}")));
            }
            Ok(AmazonS3Builder::new()
                .with_endpoint(format!("http://127.0.0.1:{}", self.port))
                .with_allow_http(true)
                .with_bucket_name("leasehold-bench")
                .with_region("us-east-1")
                .with_access_key_id("testing")
                .with_secret_access_key("testing"))
        }
    }

    fn http(port: u16, method: &str, path: &str) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response.lines().next().unwrap_or_default().to_owned())
    }
}
