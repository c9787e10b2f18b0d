//! Supervision of long-lived tasks: none ends unnoticed.
//!
//! A task that ends while the process is meant to run (it returned, failed
//! or panicked) would otherwise turn into a silent stall: fan-out waiting
//! for a directory nobody refreshes, results queued for a recorder that is
//! gone. Every long-lived task of a stage is spawned through a
//! [`Supervisor`] under a name. The first one that ends before
//! [`Supervisor::stopping`] was called fails the whole group: its error
//! (naming the task) is kept, and the group's stop token is cancelled so the
//! process stops in order and exits with that error; a restart then picks up
//! from what is durable.

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Why a supervised task failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// It returned an error.
    #[error("{task} failed")]
    Failed {
        /// The task's name.
        task: String,
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// It returned while the process was meant to keep running.
    #[error("{task} ended unexpectedly while the process was running")]
    Ended {
        /// The task's name.
        task: String,
    },
    /// It panicked.
    #[error("{task} panicked: {message}")]
    Panicked {
        /// The task's name.
        task: String,
        /// The panic's message.
        message: String,
    },
}

#[derive(Default)]
struct Shared {
    /// The first failure.
    failure: Option<TaskError>,
    /// Set once an orderly stop began: tasks may end from then on.
    stopping: bool,
}

/// Spawns named tasks and fails the group when one ends too early.
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<Mutex<Shared>>,
    fail: CancellationToken,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("failed", &self.shared.lock().failure.is_some())
            .finish()
    }
}

impl Supervisor {
    /// A supervisor that cancels `fail` when a task fails.
    pub fn new(fail: CancellationToken) -> Self {
        Supervisor {
            shared: Arc::default(),
            fail,
        }
    }

    /// Tasks ending from now on are part of an orderly stop.
    pub fn stopping(&self) {
        self.shared.lock().stopping = true;
    }

    /// Records `error` as the group's failure (the first one wins) and
    /// cancels the group.
    pub fn fail(&self, error: TaskError) {
        tracing::error!(error = %error_chain(&error), "a task failed; stopping");
        self.shared.lock().failure.get_or_insert(error);
        self.fail.cancel();
    }

    /// The first failure, if any (taken: asked once, at the end).
    pub fn take_failure(&self) -> Option<TaskError> {
        self.shared.lock().failure.take()
    }

    /// Spawns `fut` as task `name`. Its end is watched: an error fails the
    /// group; returning `Ok` or panicking fails it too unless the group is
    /// stopping. The handle resolves when the task and its watch are done.
    #[allow(clippy::disallowed_methods)] // bare spawn: the supervisor itself
    pub fn spawn<F, E>(&self, name: impl Into<String>, fut: F) -> JoinHandle<()>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        let name = name.into();
        let inner = tokio::spawn(fut);
        let me = self.clone();
        tokio::spawn(async move {
            let outcome = inner.await;
            let stopping = me.shared.lock().stopping;
            match outcome {
                Ok(Ok(())) if stopping => {}
                Ok(Ok(())) => me.fail(TaskError::Ended { task: name }),
                Ok(Err(e)) => me.fail(TaskError::Failed {
                    task: name,
                    source: Box::new(e),
                }),
                Err(e) if e.is_cancelled() && stopping => {}
                Err(e) => {
                    let message = match e.try_into_panic() {
                        Ok(p) => panic_message(p.as_ref()),
                        Err(_) => "cancelled".into(),
                    };
                    me.fail(TaskError::Panicked {
                        task: name,
                        message,
                    });
                }
            }
        })
    }
}

/// An error and its sources on one line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

/// An error for tasks that have none of their own.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Stopped(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_ending_early_fails_the_group_with_its_name() {
        let fail = CancellationToken::new();
        let sup = Supervisor::new(fail.clone());
        let quiet = sup.spawn("the directory refresher", async { Ok::<(), Stopped>(()) });
        quiet.await.unwrap();
        assert!(fail.is_cancelled());
        let err = sup.take_failure().unwrap();
        assert_eq!(
            err.to_string(),
            "the directory refresher ended unexpectedly while the process was running"
        );
    }

    #[tokio::test]
    async fn errors_and_panics_are_named_and_an_orderly_stop_is_not_a_failure() {
        let fail = CancellationToken::new();
        let sup = Supervisor::new(fail.clone());
        sup.spawn("the recorder", async {
            Err::<(), _>(Stopped("disk full".into()))
        })
        .await
        .unwrap();
        let err = sup.take_failure().unwrap();
        assert_eq!(error_chain(&err), "the recorder failed: disk full");

        let sup = Supervisor::new(CancellationToken::new());
        sup.spawn("a forwarder", async {
            if true {
                panic!("boom");
            }
            Ok::<(), Stopped>(())
        })
        .await
        .unwrap();
        assert_eq!(
            sup.take_failure().unwrap().to_string(),
            "a forwarder panicked: boom"
        );

        let fail = CancellationToken::new();
        let sup = Supervisor::new(fail.clone());
        sup.stopping();
        sup.spawn("fan-out", async { Ok::<(), Stopped>(()) })
            .await
            .unwrap();
        assert!(sup.take_failure().is_none() && !fail.is_cancelled());
    }
}
