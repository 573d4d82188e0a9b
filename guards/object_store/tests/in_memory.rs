//! The guard suite against `InMemory`, plus the store-refusal checks.

mod common;

use std::sync::Arc;

use leasehold_object_store::object_store::local::LocalFileSystem;
use leasehold_object_store::object_store::memory::InMemory;
use leasehold_object_store::object_store::path::Path;
use leasehold_object_store::{FenceError, FencedStore};

fn store() -> FencedStore {
    FencedStore::new(Arc::new(InMemory::new())).unwrap()
}

#[test]
fn stale_epoch_is_rejected_and_object_untouched() {
    common::stale_epoch_is_rejected_and_object_untouched(&store(), &Path::from("o"));
}

#[test]
fn equal_and_higher_epochs_are_admitted() {
    common::equal_and_higher_epochs_are_admitted(&store(), &Path::from("o"));
}

#[test]
fn wrong_lease_key_is_rejected() {
    common::wrong_lease_key_is_rejected(&store(), &Path::from("o"));
}

#[test]
fn admit_raises_the_floor_without_changing_content() {
    common::admit_raises_the_floor_without_changing_content(&store(), &Path::from("o"));
}

#[test]
fn fence_record_round_trips_as_object_metadata() {
    common::fence_record_round_trips_as_object_metadata(&store(), &Path::from("o"));
}

#[test]
fn racing_writers_never_lose_updates_or_go_back() {
    let store = Arc::new(store().with_max_attempts(100_000));
    common::racing_writers_never_lose_updates_or_go_back(store, &Path::from("race"), 16, 50, 0);
}

#[test]
fn local_file_system_is_refused_at_construction() {
    let dir = std::env::temp_dir().join(format!("leasehold-os-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let local = LocalFileSystem::new_with_prefix(&dir).unwrap();
    let err = FencedStore::new(Arc::new(local)).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    match &err {
        FenceError::UnsupportedStore { reason, .. } => {
            assert!(reason.contains("If-None-Match"), "{reason}")
        }
        other => panic!("expected UnsupportedStore, got {other:?}"),
    }
    assert!(err.to_string().contains("cannot be fenced"), "{err}");
}

#[test]
fn calls_from_async_code_are_refused_not_panicking() {
    let store = store();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let token = common::token("k", "o", 1);
    let err = runtime
        .block_on(async { store.write(&Path::from("o"), &token, "x") })
        .unwrap_err();
    assert!(matches!(err, FenceError::InsideAsyncRuntime), "{err:?}");
    // Dropping the store inside async code must not panic either.
    runtime.block_on(async move { drop(store) });
}

#[test]
fn inconsistent_fence_record_is_reported_as_corrupt() {
    use leasehold_object_store::object_store::{Attribute, PutOptions};
    let store = store();
    let path = Path::from("o");
    store
        .write(&path, &common::token("k", "a", 3), "x")
        .unwrap();
    // Rewrite around the guard: metadata says epoch 1, token says 3.
    common::block(&store, |inner| {
        let path = path.clone();
        async move {
            let mut options = PutOptions::default();
            options.attributes.insert(
                Attribute::Metadata(leasehold_object_store::META_EPOCH.into()),
                "1".into(),
            );
            options.attributes.insert(
                Attribute::Metadata(leasehold_object_store::META_TOKEN.into()),
                "lh1.3.k.a".into(),
            );
            inner
                .put_opts(&path, "lh1.3.k.a\ny".into(), options)
                .await
                .map(|_| ())
        }
    });
    let err = store
        .write(&path, &common::token("k", "a", 3), "z")
        .unwrap_err();
    assert!(matches!(err, FenceError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("disagrees"), "{err}");
}

#[test]
fn in_memory_takes_tokens_of_any_length_unless_limited() {
    let store = store();
    assert_eq!(store.max_token_text(), None);
    let path = Path::from("long");
    let key = "k".repeat(16 * 1024);
    let long = common::token(&key, "owner", 1);
    store.write(&path, &long, "x").unwrap();
    assert_eq!(store.read(&path).unwrap().state.key(), key);

    let limited = store.with_max_token_text(Some(leasehold_object_store::S3_MAX_TOKEN_TEXT));
    let err = limited.write(&Path::from("other"), &long, "x").unwrap_err();
    match err {
        FenceError::TokenTooLong {
            resource,
            token_len,
            max,
        } => {
            assert_eq!(resource, "other");
            assert_eq!(token_len, long.to_string().len());
            assert_eq!(max, 1791);
        }
        other => panic!("expected TokenTooLong, got {other:?}"),
    }
    let err = limited.admit(&Path::from("other"), &long).unwrap_err();
    assert!(matches!(err, FenceError::TokenTooLong { .. }), "{err:?}");
    assert_eq!(limited.state(&Path::from("other")).unwrap(), None);
}

/// An object store cannot see the lease table: a holder superseded by a
/// newer grant still writes until something raises the object's record.
/// `leasehold::guard::take_over` at the grant raises it before the new
/// holder's first write.
#[test]
fn take_over_refuses_the_superseded_holder_before_the_successor_writes() {
    use leasehold::FencingToken;
    use leasehold_object_store::ObjectGuard;

    let store = Arc::new(store());
    let path = Path::from("report");
    let token = |owner: &str, epoch: i64| {
        FencingToken::new("k", owner, leasehold::Epoch::new(epoch)).unwrap()
    };
    let (old, new) = (token("a", 3), token("b", 4));
    store.write(&path, &old, "old holder").unwrap();
    store.write(&path, &old, "old holder, late").unwrap();
    let guard = ObjectGuard::new(store.clone(), path.clone());
    leasehold::guard::take_over(&new, [&guard]).unwrap();
    match store.write(&path, &old, "old holder, too late") {
        Err(FenceError::StaleEpoch { accepted, .. }) => assert_eq!(accepted, 4),
        other => panic!("expected StaleEpoch, got {other:?}"),
    }
    assert_eq!(store.read(&path).unwrap().content, "old holder, late");
    store.write(&path, &new, "new holder").unwrap();
}
