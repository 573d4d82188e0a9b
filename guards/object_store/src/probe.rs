//! The construction probe: object_store does not report capabilities and
//! some stores silently ignore preconditions, so [`crate::FencedStore::new`]
//! tries each capability fencing relies on, under [`crate::PROBE_PREFIX`].

use std::sync::atomic::{AtomicU64, Ordering};

use object_store::path::Path;
use object_store::{
    Attribute, AttributeValue, GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, UpdateVersion,
};

use crate::error::{store_error, FenceError};
use crate::store::random_u64;
use crate::PROBE_PREFIX;

/// Checks the capabilities fencing relies on; see [`FencedStore::new`].
/// The outer error is an infrastructure failure, the inner one the verdict.
pub(crate) async fn probe(store: &dyn ObjectStore) -> Result<(), FenceError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "{PROBE_PREFIX}/{}-{}-{:016x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        random_u64()
    );
    let location = Path::from(name);
    let verdict = probe_steps(store, &location).await;
    // Best effort: a leftover probe object is harmless.
    let _ = store.delete(&location).await;
    verdict
}

async fn probe_steps(store: &dyn ObjectStore, location: &Path) -> Result<(), FenceError> {
    let unsupported = |reason: String| FenceError::UnsupportedStore {
        store: store.to_string(),
        reason,
        source: None,
    };
    let classify = |step: &str, error: object_store::Error| match error {
        object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. } => {
            FenceError::UnsupportedStore {
                store: store.to_string(),
                reason: format!("{step} failed"),
                source: Some(error),
            }
        }
        other => store_error(location, other),
    };
    let marker = Attribute::Metadata("leasehold-probe".into());
    let put = |body: &'static str, mode: PutMode| {
        let mut options = PutOptions::from(mode);
        options
            .attributes
            .insert(marker.clone(), AttributeValue::from("1"));
        store.put_opts(location, PutPayload::from_static(body.as_bytes()), options)
    };

    put("probe-1", PutMode::Create)
        .await
        .map_err(|e| classify("a create with If-None-Match and user metadata", e))?;
    match put("probe-1b", PutMode::Create).await {
        Err(object_store::Error::AlreadyExists { .. }) => {}
        Ok(_) => {
            return Err(unsupported(
                "a second create of the same object succeeded, so If-None-Match is ignored".into(),
            ))
        }
        Err(error) => return Err(classify("a repeated create", error)),
    }
    let head = store
        .get_opts(
            location,
            GetOptions {
                head: true,
                ..GetOptions::default()
            },
        )
        .await
        .map_err(|e| classify("a HEAD", e))?;
    if head.attributes.get(&marker).map(|v| v.as_ref()) != Some("1") {
        return Err(unsupported(
            "user metadata written with a PUT is not returned by HEAD".into(),
        ));
    }
    if head.meta.e_tag.is_none() && head.meta.version.is_none() {
        return Err(unsupported(
            "HEAD reports neither an ETag nor a version to compare-and-swap on".into(),
        ));
    }
    let read_version = UpdateVersion {
        e_tag: head.meta.e_tag,
        version: head.meta.version,
    };
    put("probe-2", PutMode::Update(read_version.clone()))
        .await
        .map_err(|e| classify("an update with If-Match", e))?;
    match put("probe-3", PutMode::Update(read_version)).await {
        Err(object_store::Error::Precondition { .. }) => Ok(()),
        Ok(_) => Err(unsupported(
            "an update on a superseded version succeeded, so If-Match is ignored".into(),
        )),
        Err(error) => Err(classify("an update on a superseded version", error)),
    }
}
