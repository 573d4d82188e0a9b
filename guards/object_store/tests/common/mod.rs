//! The guard suite, run against every backend (InMemory, S3 via moto).
//!
//! Each function takes a `FencedStore` and a path of its own, so the
//! backends only differ in how they build the store.

#![allow(dead_code)] // each test binary uses a subset

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use leasehold::FencingToken;
use leasehold_object_store::object_store::path::Path;
use leasehold_object_store::object_store::{
    Attribute, Error as ObjectStoreError, GetOptions, ObjectStoreExt, PutMode, PutOptions,
    UpdateVersion,
};
use leasehold_object_store::{FenceError, FencedStore, META_EPOCH, META_TOKEN, META_WRITE_ID};

pub fn token(key: &str, owner: &str, epoch: i64) -> FencingToken {
    FencingToken::new(key, owner, leasehold::Epoch::from(epoch)).unwrap()
}

/// G2: a lower epoch is refused with the typed error and the object keeps
/// its content and its epoch.
pub fn stale_epoch_is_rejected_and_object_untouched(store: &FencedStore, path: &Path) {
    store
        .write(path, &token("k", "new", 5), "from epoch 5")
        .unwrap();
    let before = store.read(path).unwrap();

    let err = store
        .write(path, &token("k", "old", 4), "from epoch 4")
        .unwrap_err();
    match err {
        FenceError::StaleEpoch {
            resource,
            presented,
            accepted,
        } => {
            assert_eq!(resource, path.to_string());
            assert_eq!(
                (presented, accepted),
                (leasehold::Epoch::new(4), leasehold::Epoch::new(5))
            );
        }
        other => panic!("expected StaleEpoch, got {other:?}"),
    }
    let after = store.read(path).unwrap();
    assert_eq!(after, before, "a refused write changed the object");
    assert_eq!(after.content, "from epoch 5");
    assert_eq!(after.state.epoch(), 5);
    assert_eq!(after.state.token.owner(), "new");
}

/// G3: the equal epoch is admitted again, a higher one too, and the epoch
/// is recorded with the content.
pub fn equal_and_higher_epochs_are_admitted(store: &FencedStore, path: &Path) {
    let created = store.write(path, &token("k", "a", 3), "one").unwrap();
    assert!(created.replaced.is_none());
    assert_eq!(created.state.epoch(), 3);

    let again = store.write(path, &token("k", "a", 3), "two").unwrap();
    assert_eq!(again.replaced.as_ref().unwrap().epoch(), 3);
    assert_eq!(store.read(path).unwrap().content, "two");

    let higher = store.write(path, &token("k", "b", 9), "three").unwrap();
    assert_eq!(higher.replaced.as_ref().unwrap().epoch(), 3);
    let read = store.read(path).unwrap();
    assert_eq!(read.content, "three");
    assert_eq!(read.state.epoch(), 9);
    assert_eq!(read.state.key(), "k");
    assert_eq!(store.state(path).unwrap().unwrap().epoch(), 9);
}

/// G5: a token of another lease is a distinct error, even with a higher
/// epoch, and leaves the object alone.
pub fn wrong_lease_key_is_rejected(store: &FencedStore, path: &Path) {
    store
        .write(path, &token("lease-a", "w", 2), "a's data")
        .unwrap();
    let err = store
        .write(path, &token("lease-b", "w", 100), "b's data")
        .unwrap_err();
    match err {
        FenceError::WrongLeaseKey {
            presented,
            fenced_by,
            ..
        } => {
            assert_eq!(presented, "lease-b");
            assert_eq!(fenced_by, "lease-a");
        }
        other => panic!("expected WrongLeaseKey, got {other:?}"),
    }
    let err = store.admit(path, &token("lease-b", "op", 100)).unwrap_err();
    assert!(matches!(err, FenceError::WrongLeaseKey { .. }), "{err:?}");
    let read = store.read(path).unwrap();
    assert_eq!(read.content, "a's data");
    assert_eq!(read.state.epoch(), 2);
}

/// The operator fence raises the floor, keeps the content, refuses going
/// down, and also works on a missing object (created empty) and adopts an
/// object written around the guard.
pub fn admit_raises_the_floor_without_changing_content(store: &FencedStore, path: &Path) {
    store.write(path, &token("k", "a", 1), "payload").unwrap();
    let receipt = store.admit(path, &token("k", "operator", 7)).unwrap();
    let replaced = receipt.replaced.clone().unwrap();
    assert_eq!(replaced.epoch(), 1);
    // Same content, but the version must change: on stores whose ETag hashes
    // the body (S3), a writer that read epoch 1 must not pass its If-Match
    // after the fence (the ABA the header line prevents).
    assert_ne!(receipt.state.e_tag, replaced.e_tag);
    let stale_version = UpdateVersion {
        e_tag: replaced.e_tag.clone(),
        version: replaced.version.clone(),
    };
    let raw = block(store, |inner| {
        let path = path.clone();
        async move {
            Ok(inner
                .put_opts(
                    &path,
                    "payload".into(),
                    PutOptions::from(PutMode::Update(stale_version)),
                )
                .await)
        }
    });
    assert!(
        matches!(raw, Err(ObjectStoreError::Precondition { .. })),
        "a conditional PUT on the pre-fence version was not refused: {raw:?}"
    );
    let read = store.read(path).unwrap();
    assert_eq!(read.content, "payload");
    assert_eq!(read.state.epoch(), 7);

    let err = store.write(path, &token("k", "a", 6), "late").unwrap_err();
    assert!(
        matches!(
            err,
            FenceError::StaleEpoch {
                presented: leasehold::Epoch(6),
                accepted: leasehold::Epoch(7),
                ..
            }
        ),
        "{err:?}"
    );
    let err = store.admit(path, &token("k", "operator", 3)).unwrap_err();
    assert!(matches!(err, FenceError::StaleEpoch { .. }), "{err:?}");
    store.write(path, &token("k", "b", 7), "b at 7").unwrap();
    assert_eq!(store.read(path).unwrap().content, "b at 7");

    // Fencing a path nobody wrote yet creates it empty, so a stale holder
    // cannot create it later.
    let missing = Path::from(format!("{path}-missing"));
    store.admit(&missing, &token("k", "operator", 4)).unwrap();
    assert_eq!(store.read(&missing).unwrap().content, "");
    let err = store.write(&missing, &token("k", "a", 3), "x").unwrap_err();
    assert!(matches!(err, FenceError::StaleEpoch { .. }), "{err:?}");

    // An object written around the guard is refused, then adopted by fence.
    let foreign = Path::from(format!("{path}-foreign"));
    block(store, |inner| {
        let foreign = foreign.clone();
        async move { inner.put(&foreign, "plain bytes".into()).await.map(|_| ()) }
    });
    let err = store.write(&foreign, &token("k", "a", 9), "x").unwrap_err();
    assert!(matches!(err, FenceError::NotFenced { .. }), "{err:?}");
    store.admit(&foreign, &token("k", "operator", 2)).unwrap();
    let read = store.read(&foreign).unwrap();
    assert_eq!(read.content, "plain bytes");
    assert_eq!(read.state.epoch(), 2);
}

/// G1 on the wire: the epoch, the token and the write id are the object's
/// own user metadata, and the body starts with the token and write id line,
/// as read back through the raw store.
pub fn fence_record_round_trips_as_object_metadata(store: &FencedStore, path: &Path) {
    let t = token("job/42 ä", "worker.1", 12);
    store.write(path, &t, "content").unwrap();
    let (attributes, body) = block(store, |inner| {
        let path = path.clone();
        async move {
            let result = inner.get_opts(&path, GetOptions::default()).await?;
            let attributes = result.attributes.clone();
            Ok((attributes, result.bytes().await?))
        }
    });
    let epoch = attributes
        .get(&Attribute::Metadata(META_EPOCH.into()))
        .expect("epoch metadata missing");
    assert_eq!(epoch.as_ref(), "12");
    let stored = attributes
        .get(&Attribute::Metadata(META_TOKEN.into()))
        .expect("token metadata missing");
    assert_eq!(stored.as_ref().parse::<FencingToken>().unwrap(), t);
    let write_id = attributes
        .get(&Attribute::Metadata(META_WRITE_ID.into()))
        .expect("write id metadata missing")
        .as_ref()
        .to_owned();
    assert_eq!(write_id.len(), 32, "{write_id}");
    assert_eq!(body, format!("{t} {write_id}\ncontent").into_bytes());
    let read = store.read(path).unwrap();
    assert_eq!(read.state.token, t);
    assert_eq!(read.state.write_id.as_deref(), Some(write_id.as_str()));
    // Every PUT gets a fresh id, so the same content at the same epoch is
    // a new version with a new ETag.
    let again = store.write(path, &t, "content").unwrap();
    assert_ne!(again.state.write_id.as_deref(), Some(write_id.as_str()));
    assert_ne!(again.state.e_tag, read.state.e_tag);
}

/// What one racing write attempt came to.
#[derive(Debug, Clone)]
struct Accepted {
    content: String,
    epoch: i64,
    replaced_e_tag: Option<String>,
    e_tag: Option<String>,
}

/// G4: many threads with mixed epochs race on one object. Each content is
/// followed by `padding` bytes, so on a server that checks `If-Match`
/// before storing a large body without a lock the race has room to bite.
///
/// The store itself tells us the accept order: every receipt names the
/// version (ETag) it replaced, and contents (hence ETags) are unique, so the
/// accepted writes must form one chain from the creating write to the final
/// object. Checked: the chain has every accepted write exactly once (no two
/// writes replaced the same version: no lost update), epochs never go down
/// along it (no lower epoch after a higher one), every refusal was a real
/// StaleEpoch, all writes of the maximum epoch were accepted (they can never
/// be stale), and the final object is the chain's last write, at the max
/// epoch.
pub fn racing_writers_never_lose_updates_or_go_back(
    store: Arc<FencedStore>,
    path: &Path,
    threads: usize,
    writes_per_thread: usize,
    padding: usize,
) {
    let barrier = Arc::new(Barrier::new(threads));
    let accepted = Arc::new(Mutex::new(Vec::<Accepted>::new()));
    let refused = Arc::new(Mutex::new(Vec::<(i64, i64)>::new()));
    let mut all_epochs = Vec::new();
    let mut handles = Vec::new();
    for t in 0..threads {
        let epochs: Vec<i64> = (0..writes_per_thread)
            .map(|w| 1 + ((t * 7 + w * 3) % 6) as i64)
            .collect();
        all_epochs.extend(epochs.iter().copied());
        let (store, path, barrier, accepted, refused) = (
            Arc::clone(&store),
            path.clone(),
            Arc::clone(&barrier),
            Arc::clone(&accepted),
            Arc::clone(&refused),
        );
        handles.push(thread::spawn(move || {
            barrier.wait();
            for (w, epoch) in epochs.into_iter().enumerate() {
                let mut content = format!("thread {t} write {w} epoch {epoch}\n");
                content.push_str(&".".repeat(padding));
                let tok = token("race", &format!("thread-{t}"), epoch);
                match store.write(&path, &tok, content.clone()) {
                    Ok(receipt) => accepted.lock().unwrap().push(Accepted {
                        content,
                        epoch,
                        replaced_e_tag: receipt.replaced.and_then(|r| r.e_tag),
                        e_tag: receipt.state.e_tag,
                    }),
                    Err(FenceError::StaleEpoch {
                        presented,
                        accepted,
                        ..
                    }) => refused
                        .lock()
                        .unwrap()
                        .push((presented.get(), accepted.get())),
                    Err(other) => panic!("unexpected error in race: {other}"),
                }
            }
        }));
    }
    for handle in handles {
        handle.join().unwrap();
    }
    let accepted = Arc::try_unwrap(accepted).unwrap().into_inner().unwrap();
    let refused = Arc::try_unwrap(refused).unwrap().into_inner().unwrap();
    assert_eq!(accepted.len() + refused.len(), threads * writes_per_thread);
    let max_epoch = *all_epochs.iter().max().unwrap();

    // Rebuild the accept order from the replaced-version links.
    let mut creators = accepted.iter().filter(|a| a.replaced_e_tag.is_none());
    let first = creators.next().expect("no write created the object");
    assert!(
        creators.next().is_none(),
        "two writes both created the object"
    );
    let mut successor: HashMap<&str, &Accepted> = HashMap::new();
    for a in accepted.iter().filter(|a| a.replaced_e_tag.is_some()) {
        let replaced = a.replaced_e_tag.as_deref().unwrap();
        if let Some(other) = successor.insert(replaced, a) {
            panic!(
                "lost update: {:?} and {:?} both replaced version {replaced}",
                other.content, a.content
            );
        }
    }
    let mut chain = vec![first];
    let mut current = first;
    while let Some(next) = current.e_tag.as_deref().and_then(|tag| successor.get(tag)) {
        chain.push(next);
        current = next;
        assert!(chain.len() <= accepted.len(), "cycle in accept chain");
    }
    assert_eq!(
        chain.len(),
        accepted.len(),
        "accepted writes do not form one chain: some replaced a version that was never current"
    );
    for pair in chain.windows(2) {
        assert!(
            pair[1].epoch >= pair[0].epoch,
            "epoch went down: {:?} accepted after {:?}",
            pair[1].content,
            pair[0].content
        );
    }
    for (presented, accepted_epoch) in &refused {
        assert!(presented < accepted_epoch, "refused a non-stale write");
        assert!(
            chain.iter().any(|a| a.epoch == *accepted_epoch),
            "refusal cited epoch {accepted_epoch} that was never accepted"
        );
    }
    let max_writes = all_epochs.iter().filter(|e| **e == max_epoch).count();
    let max_accepted = accepted.iter().filter(|a| a.epoch == max_epoch).count();
    assert_eq!(
        max_accepted, max_writes,
        "a write of the max epoch was refused"
    );

    let last = chain.last().unwrap();
    let read = store.read(path).unwrap();
    assert_eq!(read.state.epoch(), max_epoch);
    assert!(
        read.content == last.content.as_bytes(),
        "the final object is not the last write of the accept chain"
    );
    assert_eq!(read.state.e_tag, last.e_tag);
    assert!(
        !refused.is_empty(),
        "no write was stale; the epoch mix did not exercise the race"
    );
}

/// Runs an async closure against the raw store on a private runtime (the
/// tests' way to go around the guard).
pub fn block<T, F, Fut>(store: &FencedStore, f: F) -> T
where
    F: FnOnce(Arc<dyn leasehold_object_store::object_store::ObjectStore>) -> Fut,
    Fut: std::future::Future<Output = leasehold_object_store::object_store::Result<T>>,
{
    let inner = Arc::clone(store.inner());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(f(inner)).unwrap()
}
