//! The bridge from the adapter's synchronous API to object_store's async
//! one: a current-thread tokio runtime owned by each store.

use std::future::Future;

use crate::error::FenceError;

/// A runtime the adapter blocks on. Blocking from inside another async
/// runtime would stall (or panic) the caller's executor, so that is refused
/// with [`FenceError::InsideAsyncRuntime`] instead.
pub(crate) struct RuntimeBridge {
    // `Option` only so `Drop` can shut it down without blocking.
    runtime: Option<tokio::runtime::Runtime>,
}

impl RuntimeBridge {
    /// A new current-thread runtime; refused inside an async runtime.
    pub(crate) fn new() -> Result<Self, FenceError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(FenceError::InsideAsyncRuntime);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| FenceError::Runtime { source })?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Runs `future` to completion on this runtime.
    pub(crate) fn block_on<F: Future>(&self, future: F) -> Result<F::Output, FenceError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(FenceError::InsideAsyncRuntime);
        }
        match &self.runtime {
            Some(runtime) => Ok(runtime.block_on(future)),
            // Only `Drop` takes the runtime, and then nobody can call us.
            None => Err(FenceError::Runtime {
                source: std::io::Error::other("runtime already shut down"),
            }),
        }
    }
}

impl Drop for RuntimeBridge {
    fn drop(&mut self) {
        // A plain drop of a runtime panics inside async contexts; this does not.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
