//! What can go wrong in a reconcile, as one error type.
//!
//! Each message says each thing once. The operator logs errors by their
//! `Display` (one line, `tracing`'s `%error`), so a variant that wraps
//! another error says it in its text and does not also hand it out as its
//! `source()` (a reporter that walks sources would print it again). Two
//! wrappers say things twice on their own and are rendered here instead:
//! kube's API error (`ApiError: {status} ({status:?})`: the message and
//! reason, then the same again as debug output) and kube's finalizer error,
//! whose "failed to apply object" only repeats that a reconcile failed.

/// What can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {}", kube_text(.0))]
    Kube(kube::Error),
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
    #[error("{}", finalizer_text(.0))]
    Finalizer(Box<kube::runtime::finalizer::Error<Error>>),
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

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Kube(e)
    }
}

/// A kube error in one line: an API refusal as its message, reason and
/// HTTP code; anything else as kube says it.
fn kube_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            let mut text = status.message.clone();
            if text.is_empty() {
                text = "no message".to_owned();
            }
            if status.reason.is_empty() {
                format!("{text} (HTTP {})", status.code)
            } else {
                format!("{text} ({}, HTTP {})", status.reason, status.code)
            }
        }
        other => other.to_string(),
    }
}

/// The finalizer's error, naming the finalizer's own step only when it is
/// one (the apply and cleanup branches are the reconcile itself).
fn finalizer_text(e: &kube::runtime::finalizer::Error<Error>) -> String {
    use kube::runtime::finalizer::Error as F;
    match e {
        F::ApplyFailed(inner) => inner.to_string(),
        F::CleanupFailed(inner) => format!("cleaning up: {inner}"),
        F::AddFinalizer(k) => format!("adding the finalizer: Kubernetes API: {}", kube_text(k)),
        F::RemoveFinalizer(k) => {
            format!("removing the finalizer: Kubernetes API: {}", kube_text(k))
        }
        other => format!("the finalizer: {other}"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::finalizer::Error as F;
    use std::error::Error as _;

    fn forbidden() -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("pods \"j-3\" is forbidden: exceeded quota", "Forbidden")
                .with_code(403)
                .boxed(),
        )
    }

    /// The message and everything a reporter would add from the source
    /// chain: what a reader sees in the worst case.
    fn with_sources(e: &Error) -> String {
        let mut text = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            text.push_str(&format!(" <- {s}"));
            source = s.source();
        }
        text
    }

    #[test]
    fn a_reconcile_error_says_each_thing_once() {
        let cases: Vec<(Error, &str)> = vec![
            (
                Error::from(forbidden()),
                "Kubernetes API: pods \"j-3\" is forbidden: exceeded quota (Forbidden, HTTP 403)",
            ),
            (
                Error::Finalizer(Box::new(F::ApplyFailed(Error::from(forbidden())))),
                "Kubernetes API: pods \"j-3\" is forbidden: exceeded quota (Forbidden, HTTP 403)",
            ),
            (
                Error::Finalizer(Box::new(F::CleanupFailed(Error::PodCache(
                    "none covers namespace ns".into(),
                )))),
                "cleaning up: pod cache: none covers namespace ns",
            ),
            (
                Error::Finalizer(Box::new(F::AddFinalizer(forbidden()))),
                "adding the finalizer: Kubernetes API: pods \"j-3\" is forbidden: exceeded quota (Forbidden, HTTP 403)",
            ),
            (
                Error::Finalizer(Box::new(F::ApplyFailed(Error::Secret {
                    name: "j-secret".into(),
                    problem: "no key secret".into(),
                }))),
                "job secret j-secret: no key secret",
            ),
        ];
        for (error, want) in cases {
            assert_eq!(with_sources(&error), want);
            for word in ["Kubernetes API", "forbidden", "Forbidden", "failed to", "pod cache"] {
                assert!(
                    want.matches(word).count() <= 1,
                    "{word:?} said twice in {want:?}"
                );
            }
        }
    }

    #[test]
    fn the_metric_class_looks_through_the_finalizer() {
        let e = Error::Finalizer(Box::new(F::ApplyFailed(Error::from(forbidden()))));
        assert_eq!(e.class(), "kube");
    }
}
