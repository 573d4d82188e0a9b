//! The guard suite against a real S3-compatible server: `moto_server`,
//! started on loopback by these tests and killed when the last test using it
//! is done.
//!
//! Needs `pip install 'moto[server]'`. Without `moto_server` on PATH these
//! tests fail (they do not skip silently) unless `LEASEHOLD_SKIP_S3=1`.

#![cfg(feature = "s3")]

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use leasehold_object_store::object_store::aws::AmazonS3Builder;
use leasehold_object_store::object_store::path::Path;
use leasehold_object_store::FencedStore;

/// A running moto_server; killed on drop.
struct Moto {
    child: Child,
    port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One server shared by the tests that run concurrently; started again if
/// all previous users are gone.
fn moto() -> Arc<Moto> {
    static SHARED: Mutex<Weak<Moto>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(moto) = slot.upgrade() {
        return moto;
    }
    let moto = Arc::new(start_moto());
    *slot = Arc::downgrade(&moto);
    moto
}

fn start_moto() -> Moto {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("no free loopback port")
        .port();
    let child = match Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "moto_server is not installed; the S3 tests need it: \
             pip install 'moto[server]' (or set LEASEHOLD_SKIP_S3=1 to skip them)"
        ),
        Err(e) => panic!("could not start moto_server: {e}"),
    };
    let mut moto = Moto { child, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = moto.child.try_wait() {
            panic!("moto_server exited during startup with {status}");
        }
        if http(port, "GET", "/").is_ok() {
            return moto;
        }
        assert!(
            Instant::now() < deadline,
            "moto_server did not answer on 127.0.0.1:{port} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A minimal HTTP/1.1 request; returns the status line.
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

/// A fenced store on a fresh bucket, or `None` when S3 tests are skipped.
fn fenced() -> Option<(FencedStore, Arc<Moto>)> {
    if std::env::var("LEASEHOLD_SKIP_S3").as_deref() == Ok("1") {
        eprintln!("LEASEHOLD_SKIP_S3=1: skipping S3 test");
        return None;
    }
    static BUCKETS: AtomicUsize = AtomicUsize::new(0);
    let moto = moto();
    let bucket = format!(
        "leasehold-{}-{}",
        std::process::id(),
        BUCKETS.fetch_add(1, Ordering::Relaxed)
    );
    let status = http(moto.port, "PUT", &format!("/{bucket}")).expect("bucket creation request");
    assert!(status.contains(" 200 "), "creating bucket: {status}");
    let builder = AmazonS3Builder::new()
        .with_endpoint(format!("http://127.0.0.1:{}", moto.port))
        .with_allow_http(true)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing");
    Some((FencedStore::s3(builder).unwrap(), moto))
}

#[test]
fn s3_stale_epoch_is_rejected_and_object_untouched() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::stale_epoch_is_rejected_and_object_untouched(&store, &Path::from("o"));
}

#[test]
fn s3_equal_and_higher_epochs_are_admitted() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::equal_and_higher_epochs_are_admitted(&store, &Path::from("o"));
}

#[test]
fn s3_wrong_lease_key_is_rejected() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::wrong_lease_key_is_rejected(&store, &Path::from("o"));
}

#[test]
fn s3_admit_raises_the_floor_without_changing_content() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::admit_raises_the_floor_without_changing_content(&store, &Path::from("o"));
}

#[test]
fn s3_fence_record_round_trips_as_object_metadata() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::fence_record_round_trips_as_object_metadata(&store, &Path::from("o"));
}

#[test]
fn s3_racing_writers_never_lose_updates_or_go_back() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    let store = Arc::new(store.with_max_attempts(10_000));
    common::racing_writers_never_lose_updates_or_go_back(store, &Path::from("race"), 8, 8);
}

#[test]
fn s3_without_conditional_put_is_refused_at_construction() {
    let Some((_store, moto)) = fenced() else {
        return;
    };
    let status = http(moto.port, "PUT", "/leasehold-plain").unwrap();
    assert!(status.contains(" 200 "), "creating bucket: {status}");
    let plain = AmazonS3Builder::new()
        .with_endpoint(format!("http://127.0.0.1:{}", moto.port))
        .with_allow_http(true)
        .with_bucket_name("leasehold-plain")
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .with_conditional_put(leasehold_object_store::object_store::aws::S3ConditionalPut::Disabled)
        .build()
        .unwrap();
    let err = FencedStore::new(Arc::new(plain)).unwrap_err();
    assert!(
        matches!(
            err,
            leasehold_object_store::FenceError::UnsupportedStore { .. }
        ),
        "{err:?}"
    );
}
