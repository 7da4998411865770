//! What can go wrong in a reconcile, as one error type.

/// What can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The ElasticJob has no namespace (it is a namespaced resource).
    #[error("ElasticJob {0} has no namespace")]
    NoNamespace(String),
    /// The job secret named by `spec.secretRef` is missing or malformed.
    #[error("job secret {name}: {problem}")]
    Secret {
        /// The Secret's name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// Adding or removing the finalizer, or the work it wraps, failed.
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// An object the job needs exists and is managed by someone else (a
    /// server-side apply conflict): the operator does not take it over.
    #[error("{object} exists and another field manager owns its fields (rename the job or delete it): {message}")]
    NotOwned {
        /// `kind/name` of the object.
        object: String,
        /// The API server's message.
        message: String,
    },
    /// The controllers' pod cache cannot answer (not listed yet, or its
    /// watch ended).
    #[error("pod cache: {0}")]
    PodCache(String),
    /// A blocking call to the control endpoint could not run.
    #[error("control endpoint task: {0}")]
    Task(String),
}

impl Error {
    /// A short class for the error metric.
    pub fn class(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::NoNamespace(_) => "no-namespace",
            Error::Secret { .. } => "secret",
            Error::Task(_) => "task",
            Error::PodCache(_) => "pod-cache",
            Error::NotOwned { .. } => "not-owned",
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.class(),
                _ => "finalizer",
            },
        }
    }
}

/// Result of the reconciler's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
