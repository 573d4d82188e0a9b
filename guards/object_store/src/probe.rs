//! The construction probe: object_store does not report capabilities and
//! some stores silently ignore preconditions, so [`crate::FencedStore::new`]
//! tries each capability fencing relies on, under [`crate::PROBE_PREFIX`].
//!
//! Trying each step one at a time shows that a store *has* conditional PUT,
//! not that it is atomic. A store can check `If-Match` and then store the
//! body without holding a lock (moto as shipped does, which shows once
//! bodies take a while to store, from about 5 MiB), so two PUTs on the same
//! version both succeed and an acknowledged write is overwritten. The last
//! step therefore races two such PUTs with large bodies, a few times.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;

use bytes::Bytes;

use object_store::path::Path;
use object_store::{
    Attribute, AttributeValue, GetOptions, GetResult, ObjectStore, ObjectStoreExt, PutMode,
    PutOptions, PutPayload, PutResult, UpdateVersion,
};

use crate::error::{store_error, FenceError};
use crate::store::random_u64;
use crate::PROBE_PREFIX;

/// Body size of each PUT in the probe's compare-and-swap race: 8 MiB.
///
/// Large enough that a store which checks `If-Match` before storing the
/// body, without a lock, has both racing PUTs past the check before either
/// is stored (moto as shipped loses the race from about 5 MiB), small
/// enough to keep the probe to well under a second on a local store.
pub const PROBE_RACE_BODY_BYTES: usize = 8 << 20;

/// Rounds of the probe's compare-and-swap race: each round sends
/// [`PROBE_RACERS`] `If-Match` PUTs of [`PROBE_RACE_BODY_BYTES`] on the same
/// version at the same time, and the store passes only if in every round
/// exactly one succeeds and the others are refused by their precondition.
///
/// A race that does not overlap proves nothing, hence several rounds. moto
/// as shipped gives itself away in a little over half of the rounds (60
/// constructions measured: 110 rounds, 60 catches, every construction
/// caught by round 4), so 8 rounds let it through about twice in a
/// thousand constructions (0.45^8). The probe stops
/// at the first round that catches a store; an atomic one costs all
/// rounds: 16 PUTs, 128 MiB uploaded (measured: 0.6 to 0.8 s against moto
/// on loopback, about 40 ms on `InMemory`).
pub const PROBE_RACE_ROUNDS: usize = 8;

/// Conditional PUTs sent at the same time in each round of the race. Two:
/// a third made moto's races overlap less often, not more (measured).
pub const PROBE_RACERS: usize = 2;

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
    let head = head(store, location, &classify).await?;
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
        Err(object_store::Error::Precondition { .. }) => {}
        Ok(_) => {
            return Err(unsupported(
                "an update on a superseded version succeeded, so If-Match is ignored".into(),
            ))
        }
        Err(error) => return Err(classify("an update on a superseded version", error)),
    }

    race_rounds(store, location, &classify).await
}

/// A HEAD of the probe object, its failure classified as the probe's.
async fn head(
    store: &dyn ObjectStore,
    location: &Path,
    classify: &impl Fn(&str, object_store::Error) -> FenceError,
) -> Result<GetResult, FenceError> {
    let options = GetOptions {
        head: true,
        ..GetOptions::default()
    };
    store
        .get_opts(location, options)
        .await
        .map_err(|e| classify("a HEAD", e))
}

/// The compare-and-swap race: [`PROBE_RACE_ROUNDS`] rounds of two `If-Match`
/// PUTs on the same version, sent at the same time. A round is *clean* when
/// one succeeds and the other is refused by its precondition, and the
/// winner is then the current version. The store passes only if every
/// round is clean:
///
/// * both succeed: not atomic;
/// * one succeeds and the other fails with any other error: the failed one
///   may have been applied too, and nothing visible afterwards can tell
///   (moto as shipped answers 500 in exactly that case: it stored both,
///   and the second store broke the first's answer). So the store is not
///   shown atomic and is refused as well; a transient error on a healthy
///   store makes construction fail, and constructing again is the remedy;
/// * both refused: no evidence either way; the round is repeated, at most
///   [`PROBE_RACE_ROUNDS`] times in all.
async fn race_rounds(
    store: &dyn ObjectStore,
    location: &Path,
    classify: &impl Fn(&str, object_store::Error) -> FenceError,
) -> Result<(), FenceError> {
    let unsupported =
        |reason: String, source: Option<object_store::Error>| FenceError::UnsupportedStore {
            store: store.to_string(),
            reason,
            source,
        };
    let head = || head(store, location, classify);
    // As many requests at once as there are racers first, so an HTTP
    // client has that many connections open and the first round's PUTs
    // start together instead of waiting for new connections.
    let warm_up = (0..PROBE_RACERS)
        .map(|_| Box::pin(async { head().await.map(drop) }) as _)
        .collect();
    for answer in all::<Result<(), FenceError>>(warm_up).await {
        answer?;
    }

    let filler = Bytes::from(vec![b'.'; PROBE_RACE_BODY_BYTES]);
    let (mut clean, mut both_refused) = (0, 0);
    while clean < PROBE_RACE_ROUNDS {
        let round = clean + both_refused + 1;
        let current = head().await?;
        let version = UpdateVersion {
            e_tag: current.meta.e_tag,
            version: current.meta.version,
        };
        let racer = |side: usize| {
            let body: PutPayload = [
                Bytes::from(format!("race {round} {side}\n")),
                filler.clone(),
            ]
            .into_iter()
            .collect();
            store.put_opts(
                location,
                body,
                PutOptions::from(PutMode::Update(version.clone())),
            )
        };
        let racers = (0..PROBE_RACERS)
            .map(|side| Box::pin(racer(side)) as _)
            .collect();
        let (won, failed): (Vec<_>, Vec<_>) =
            all(racers).await.into_iter().partition(Result::is_ok);
        let won: Vec<PutResult> = won.into_iter().filter_map(Result::ok).collect();
        let failed: Vec<object_store::Error> = failed.into_iter().filter_map(Result::err).collect();
        let unrefused = failed.into_iter().find(|error| !is_refusal(error));
        let winner = match (won.len(), unrefused) {
            (0, None) => {
                both_refused += 1;
                if both_refused >= PROBE_RACE_ROUNDS {
                    return Err(unsupported(
                        format!(
                            "{PROBE_RACERS} If-Match updates on the same version, sent at the \
                             same time, were all refused in {both_refused} rounds, so its \
                             compare-and-swap could not be shown atomic"
                        ),
                        None,
                    ));
                }
                continue;
            }
            (0, Some(error)) => return Err(classify("a racing update", error)),
            (1, Some(error)) => {
                return Err(unsupported(
                    format!(
                        "of {PROBE_RACERS} If-Match updates on the same version, sent at the \
                         same time, one succeeded and another failed without being refused by \
                         its precondition (race round {round}), so the store may have applied \
                         both: its compare-and-swap is not shown atomic"
                    ),
                    Some(error),
                ))
            }
            (1, None) => won.into_iter().next(),
            (both, _) => {
                return Err(unsupported(
                    format!(
                        "{both} of {PROBE_RACERS} If-Match updates on the same version, sent at \
                         the same time, succeeded (race round {round}, {PROBE_RACE_BODY_BYTES} \
                         bytes each), so its compare-and-swap is not atomic"
                    ),
                    None,
                ))
            }
        };
        let Some(winner) = winner else { continue };
        let after = head().await?;
        if (after.meta.e_tag, after.meta.version) != (winner.e_tag, winner.version) {
            return Err(unsupported(
                format!(
                    "after racing If-Match updates (round {round}), the current version \
                     is not the one the store acknowledged, so its compare-and-swap is not atomic"
                ),
                None,
            ));
        }
        clean += 1;
    }
    Ok(())
}

/// A conditional PUT refused by its precondition (or, as a 409, by a
/// concurrent conditional write).
fn is_refusal(error: &object_store::Error) -> bool {
    matches!(
        error,
        object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }
    )
}

/// Runs the futures concurrently (on the caller's task) and returns their
/// outputs in order: the PUTs of a race must be in flight at the same time.
async fn all<'a, T>(futures: Vec<Pin<Box<dyn Future<Output = T> + 'a>>>) -> Vec<T> {
    let mut futures = futures;
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                if let Poll::Ready(value) = future.as_mut().poll(cx) {
                    *output = Some(value);
                }
            }
        }
        if outputs.iter().all(Option::is_some) {
            Poll::Ready(outputs.iter_mut().filter_map(Option::take).collect())
        } else {
            Poll::Pending
        }
    })
    .await
}
