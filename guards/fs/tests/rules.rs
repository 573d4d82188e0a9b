//! The guard rules (G1 to G5) and bad-input handling, on real files in one
//! process.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{payload, scratch, temp_files};
use leasehold::FencingToken;
use leasehold_fs::{Epoch, FenceError, FencedFile, GuardRecord};

fn token(key: &str, epoch: i64) -> FencingToken {
    FencingToken::new(key, "owner", leasehold::Epoch::from(epoch)).unwrap()
}

/// Raw bytes and inode: a refused write must change neither (no rename).
fn fingerprint(path: &std::path::Path) -> (Vec<u8>, u64) {
    (fs::read(path).unwrap(), fs::metadata(path).unwrap().ino())
}

#[test]
fn stale_token_is_refused_and_file_bytes_untouched() {
    let dir = scratch("stale");
    let path = dir.join("data.bin");
    let file = FencedFile::new(&path).unwrap();
    file.write(&token("k", 5), b"epoch five").unwrap();
    let before = fingerprint(&path);

    for stale in [4, 1] {
        let error = file.write(&token("k", stale), b"stale bytes").unwrap_err();
        match &error {
            FenceError::StaleEpoch {
                resource,
                presented,
                accepted,
            } => {
                assert_eq!(resource, &path);
                assert_eq!((*presented, *accepted), (Epoch(stale), Epoch(5)));
            }
            other => panic!("expected StaleEpoch, got {other:?}"),
        }
        assert!(error.is_stale());
        let message = error.to_string();
        // One line naming the file and both epochs; the cause is the variant.
        assert!(
            message.contains("data.bin")
                && message.contains(&stale.to_string())
                && !message.contains('\n'),
            "{message}"
        );
        assert_eq!(
            fingerprint(&path),
            before,
            "a refused write touched the file"
        );
        assert!(temp_files(&path).is_empty());
    }
    assert_eq!(
        file.read().unwrap(),
        (leasehold::Epoch::new(5), b"epoch five".to_vec())
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn equal_epoch_is_admitted_again_and_higher_raises_the_record() {
    let dir = scratch("equal");
    let file = FencedFile::new(dir.join("f")).unwrap();
    assert_eq!(file.record().unwrap(), None);
    assert_eq!(file.write(&token("k", 3), b"a").unwrap(), record("k", 3, 0));
    // Same grant, possibly another owner string: the epoch is what counts.
    let same = FencingToken::new("k", "other-owner", leasehold::Epoch::from(3)).unwrap();
    assert_eq!(file.write(&same, b"b").unwrap(), record("k", 3, 0));
    assert_eq!(
        file.read().unwrap(),
        (leasehold::Epoch::new(3), b"b".to_vec())
    );
    file.write(&token("k", 9), b"c").unwrap();
    assert_eq!(file.record().unwrap(), Some(record("k", 9, 0)));
    assert!(file.write(&token("k", 8), b"d").unwrap_err().is_stale());
    assert_eq!(
        file.read().unwrap(),
        (leasehold::Epoch::new(9), b"c".to_vec())
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn token_of_another_lease_key_is_refused_as_misuse() {
    let dir = scratch("wrongkey");
    let path = dir.join("f");
    let file = FencedFile::new(&path).unwrap();
    file.write(&token("orders", 2), b"mine").unwrap();
    let before = fingerprint(&path);

    // Even a much higher epoch of another lease must not get in.
    let error = file.write(&token("invoices", 100), b"theirs").unwrap_err();
    match &error {
        FenceError::WrongLeaseKey {
            resource,
            fenced_by,
            presented,
        } => {
            assert_eq!(resource, &path);
            assert_eq!(
                (fenced_by.as_str(), presented.as_str()),
                ("orders", "invoices")
            );
        }
        other => panic!("expected WrongLeaseKey, got {other:?}"),
    }
    assert!(!error.is_stale());
    assert_eq!(fingerprint(&path), before);
    // Operator methods check the key too.
    assert!(matches!(
        file.fence("invoices", leasehold::Epoch::from(50)),
        Err(FenceError::WrongLeaseKey { .. })
    ));
    assert!(matches!(
        FencedFile::create(&path, "invoices"),
        Err(FenceError::WrongLeaseKey { .. })
    ));
    assert_eq!(fingerprint(&path), before);

    // create() fences before the first write, so a foreign first write fails.
    let created = FencedFile::create(dir.join("g"), "orders").unwrap();
    assert_eq!(
        created.read().unwrap(),
        (leasehold::Epoch::new(0), Vec::new())
    );
    assert!(matches!(
        created.write(&token("invoices", 1), b"x"),
        Err(FenceError::WrongLeaseKey { .. })
    ));
    // create() again with the same key is a no-op; keys survive encoding.
    FencedFile::create(dir.join("g"), "orders").unwrap();
    let odd = FencedFile::create(dir.join("h"), "a b.c/ä%").unwrap();
    odd.write(&token("a b.c/ä%", 1), b"ok").unwrap();
    assert_eq!(odd.record().unwrap().unwrap().lease_key, "a b.c/ä%");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn fence_refuses_every_epoch_up_to_and_including_the_floor() {
    let dir = scratch("fence");
    let path = dir.join("f");
    let file = FencedFile::new(&path).unwrap();
    file.write(&token("k", 3), b"three").unwrap();

    assert_eq!(
        file.fence("k", leasehold::Epoch::from(7)).unwrap(),
        record("k", 3, 7)
    );
    let before = fingerprint(&path);
    for epoch in 1..=7 {
        match file.write(&token("k", epoch), b"late").unwrap_err() {
            FenceError::StaleEpoch {
                presented,
                accepted,
                ..
            } => assert_eq!((presented, accepted), (Epoch(epoch), Epoch(8))),
            other => panic!("epoch {epoch}: expected StaleEpoch, got {other:?}"),
        }
    }
    assert_eq!(fingerprint(&path), before);
    // Content is unchanged by fencing.
    assert_eq!(
        file.read().unwrap(),
        (leasehold::Epoch::new(3), b"three".to_vec())
    );
    // A lower floor changes nothing; the floor never goes down.
    assert_eq!(
        file.fence("k", leasehold::Epoch::from(2)).unwrap(),
        record("k", 3, 7)
    );
    assert!(file.write(&token("k", 7), b"x").unwrap_err().is_stale());
    file.write(&token("k", 8), b"eight").unwrap();
    assert_eq!(file.record().unwrap(), Some(record("k", 8, 7)));

    // Fencing a file that does not exist yet creates it, fenced to the key.
    let fresh = FencedFile::new(dir.join("fresh")).unwrap();
    assert_eq!(
        fresh.fence("k", leasehold::Epoch::from(4)).unwrap(),
        record("k", 0, 4)
    );
    assert!(fresh.write(&token("k", 4), b"x").unwrap_err().is_stale());
    fresh.write(&token("k", 5), b"y").unwrap();

    assert!(matches!(
        file.fence("k", leasehold::Epoch::from(-1)),
        Err(FenceError::NegativeEpoch {
            epoch: leasehold::Epoch(-1),
            ..
        })
    ));
    assert!(matches!(
        file.fence("", leasehold::Epoch::from(9)),
        Err(FenceError::EmptyKey { .. })
    ));
    fs::remove_dir_all(dir).unwrap();
}

/// The record a file with payload epoch `epoch`, fenced through
/// `fenced_through`, reports: it admits from the higher of the payload's
/// epoch and one above the fence.
fn record(key: &str, epoch: i64, fenced_through: i64) -> GuardRecord {
    GuardRecord {
        lease_key: key.to_owned(),
        accepted_epoch: Epoch(epoch.max(fenced_through + 1)),
    }
}

/// The admission rule, modelled apart from the crate.
struct Model {
    epoch: i64,
    fenced_through: i64,
}

impl Model {
    fn admits(&self, epoch: i64) -> bool {
        epoch >= self.epoch && epoch > self.fenced_through
    }

    fn record(&self) -> GuardRecord {
        record("k", self.epoch, self.fenced_through)
    }
}

#[test]
fn record_never_decreases_under_mixed_operations() {
    let dir = scratch("monotonic");
    let file = FencedFile::new(dir.join("f")).unwrap();
    // A model of the rule, driven by a deterministic pseudo-random sequence.
    let mut model = Model {
        epoch: 0,
        fenced_through: 0,
    };
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for step in 0..300 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let epoch = (seed % 40) as i64 + step / 10;
        if seed.is_multiple_of(5) {
            let got = file.fence("k", leasehold::Epoch::from(epoch)).unwrap();
            if epoch > model.fenced_through && epoch >= model.epoch {
                model.fenced_through = epoch;
            }
            assert_eq!(got, model.record(), "step {step}");
        } else {
            let epoch = epoch.max(1);
            let result = file.write(&token("k", epoch), &epoch.to_le_bytes());
            assert_eq!(
                result.is_ok(),
                model.admits(epoch),
                "step {step} epoch {epoch}"
            );
            if result.is_ok() {
                model.epoch = epoch;
            }
        }
        let record = file.record().unwrap().unwrap();
        assert_eq!(record, model.record(), "step {step}");
    }
    assert!(
        model.epoch > 20,
        "the sequence should have admitted many writes"
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_input_gets_typed_errors_that_say_what_to_do() {
    let dir = scratch("badinput");
    for bad in ["", "/", "some/dir/", "a/.."] {
        match FencedFile::new(bad) {
            Err(FenceError::InvalidPath { reason, .. }) => assert!(!reason.is_empty()),
            other => panic!("{bad:?}: expected InvalidPath, got {other:?}"),
        }
    }
    assert!(matches!(
        FencedFile::new(&dir),
        Err(FenceError::InvalidPath { .. })
    ));
    std::os::unix::fs::symlink(dir.join("target"), dir.join("link")).unwrap();
    assert!(matches!(
        FencedFile::new(dir.join("link")),
        Err(FenceError::InvalidPath { .. })
    ));
    assert!(matches!(
        FencedFile::create(dir.join("f"), ""),
        Err(FenceError::EmptyKey { .. })
    ));

    let missing = FencedFile::new(dir.join("missing")).unwrap();
    let error = missing.read().unwrap_err();
    assert!(matches!(error, FenceError::NotFenced { .. }));
    assert!(error.to_string().contains("not fenced yet"), "{error}");

    let no_dir = FencedFile::new(dir.join("no-such-dir").join("f")).unwrap();
    let error = no_dir.write(&token("k", 1), b"x").unwrap_err();
    assert!(matches!(error, FenceError::Io { .. }), "{error:?}");
    // The I/O error is kept as the source, not repeated in the message.
    let source = std::error::Error::source(&error).expect("the I/O error is kept");
    assert!(
        source.downcast_ref::<std::io::Error>().is_some(),
        "{source:?}"
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn corrupt_files_are_reported_and_never_overwritten() {
    let dir = scratch("corrupt");
    let good = {
        let file = FencedFile::new(dir.join("good")).unwrap();
        file.write(&token("k", 2), b"payload").unwrap();
        fs::read(dir.join("good")).unwrap()
    };
    let mut truncated = good.clone();
    truncated.pop();
    let mut extended = good.clone();
    extended.push(b'!');
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("not ours", b"just some text\n".to_vec()),
        ("no newline", b"lhfs1 2 0 7 k".to_vec()),
        ("future version", b"lhfs2 2 0 0 k\n".to_vec()),
        ("bad epoch", b"lhfs1 -2 0 0 k\n".to_vec()),
        ("huge epoch", b"lhfs1 99999999999999999999 0 0 k\n".to_vec()),
        ("bad key", b"lhfs1 2 0 0 k%zz\n".to_vec()),
        ("empty key", b"lhfs1 2 0 0 \n".to_vec()),
        ("truncated", truncated),
        ("extended", extended),
    ];
    for (name, bytes) in cases {
        let path = dir.join("f");
        fs::write(&path, &bytes).unwrap();
        let file = FencedFile::new(&path).unwrap();
        for error in [
            file.write(&token("k", 50), b"new").unwrap_err(),
            file.read().unwrap_err(),
            file.record().unwrap_err(),
            file.fence("k", leasehold::Epoch::from(60)).unwrap_err(),
        ] {
            match &error {
                FenceError::Corrupt { reason, .. } => assert!(!reason.is_empty()),
                other => panic!("{name}: expected Corrupt, got {other:?}"),
            }
            assert!(
                error.to_string().contains("not a valid fenced file"),
                "{error}"
            );
        }
        assert_eq!(
            fs::read(&path).unwrap(),
            bytes,
            "{name}: corrupt file was modified"
        );
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn leftover_temp_files_of_dead_writers_go_and_a_live_writers_stays() {
    let dir = scratch("leftover");
    let path = dir.join("f");
    let file = FencedFile::new(&path).unwrap();
    file.write(&token("k", 1), b"one").unwrap();
    // A writer that died: a process that has exited and been reaped.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let dead_temp = dir.join(format!(".f.lhfs-tmp.{dead_pid}.0"));
    fs::write(&dead_temp, b"half a version from a writer that died").unwrap();
    // A live writer's (this test's parent process is alive): never touched.
    let live_temp = dir.join(format!(
        ".f.lhfs-tmp.{}.7",
        std::os::unix::process::parent_id()
    ));
    fs::write(&live_temp, b"a live writer's next version").unwrap();

    file.write(&token("k", 2), b"two").unwrap();
    assert_eq!(
        file.read().unwrap(),
        (leasehold::Epoch::new(2), b"two".to_vec())
    );
    assert_eq!(temp_files(&path), vec![live_temp.clone()]);
    assert_eq!(
        fs::read(&live_temp).unwrap(),
        b"a live writer's next version"
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn permissions_of_the_file_are_kept_across_writes() {
    let dir = scratch("perms");
    let path = dir.join("f");
    let file = FencedFile::new(&path).unwrap();
    file.write(&token("k", 1), b"one").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
    file.write(&token("k", 2), b"two").unwrap();
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o640
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn readers_never_see_a_mix_while_threads_write() {
    let dir = scratch("readers");
    let file = FencedFile::new(dir.join("f")).unwrap();
    file.write(&token("k", 1), &payload(1, 256 * 1024)).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (file, done) = (file.clone(), done.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                let mut last = 0;
                while !done.load(Ordering::Acquire) || reads == 0 {
                    let (epoch, bytes) = file.read().unwrap();
                    assert_eq!(
                        bytes,
                        payload(epoch.get(), 256 * 1024),
                        "mixed version at {epoch}"
                    );
                    assert!(epoch >= last, "epoch went down from {last} to {epoch}");
                    last = epoch.get();
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    // Two writer threads with interleaved epochs: threads serialise too.
    let writers: Vec<_> = (0..2)
        .map(|parity| {
            let file = file.clone();
            std::thread::spawn(move || {
                for epoch in (2..60).filter(|e| e % 2 == parity) {
                    let _ = file.write(&token("k", epoch), &payload(epoch, 256 * 1024));
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    done.store(true, Ordering::Release);
    for reader in readers {
        assert!(reader.join().unwrap() > 0);
    }
    let (epoch, bytes) = file.read().unwrap();
    assert_eq!(epoch, 59);
    assert_eq!(bytes, payload(59, 256 * 1024));
    fs::remove_dir_all(dir).unwrap();
}

/// The gap a file guard has, and `leasehold::guard::take_over` closing it:
/// a file cannot see the lease table, so a holder superseded by a newer
/// grant still writes until something raises the file's record. Taking the
/// file over at the grant raises it before the new holder's first write.
#[test]
fn take_over_refuses_the_superseded_holder_before_the_successor_writes() {
    let dir = scratch("take-over");
    let path = dir.join("data.bin");
    let file = FencedFile::new(&path).unwrap();
    let old = token("k", 3);
    let new = token("k", 4);
    file.write(&old, b"old holder").unwrap();
    // The successor was granted epoch 4 and has not taken the file over:
    // the old holder's write still lands.
    file.write(&old, b"old holder, late").unwrap();
    leasehold::guard::take_over(&new, [&file]).unwrap();
    let before = fingerprint(&path);
    assert!(file
        .write(&old, b"old holder, too late")
        .unwrap_err()
        .is_stale());
    assert_eq!(fingerprint(&path), before);
    assert_eq!(
        file.read().unwrap(),
        (Epoch::new(4), b"old holder, late".to_vec())
    );
    file.write(&new, b"new holder").unwrap();
}
