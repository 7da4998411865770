//! The rescale's `tracing` spans on one node, so that
//! `DUCTILE_LOG=ductile=debug` shows one rescale as one tree: a `rescale`
//! span per node (the epoch it leaves and the node's id in it as fields),
//! under it one span per stage the node's driver goes through (`stop`,
//! `commit`, `reconcile`, each with the epoch), and under the `rescale`
//! span each PE's `reentry` (`pe/reentry.rs`, which gets the span with its
//! [`crate::pe::Reentry`]). The shell enters the stage's span while it
//! feeds the driver and carries out its actions, so what they log nests
//! there too. A newcomer's tree starts at `reconcile`, with the epoch it
//! joins.
//!
//! Spans log their close with their time (`FmtSpan::CLOSE`), so each
//! stage's time on each node is in the log; the `rescale` span closes when
//! the last PE finished its re-entry.
//!
//! May touch: nothing but `tracing`.

use ductile_coordinator::proto::NodeId;
use tracing::{debug_span, Span};

use super::Stage;

/// The open spans of the rescale under way on this node, if any.
#[derive(Default)]
pub(crate) struct RescaleSpans {
    rescale: Option<Span>,
    stage: Option<(Stage, Span)>,
}

impl RescaleSpans {
    /// Follows the driver: `at` is the stage its rescale is in with the
    /// epoch it leaves (a newcomer: the one it joins), None when no
    /// rescale is under way; `node` is this node's id in that epoch.
    pub(crate) fn follow(&mut self, at: Option<(Stage, u64)>, node: NodeId) {
        let Some((stage, epoch)) = at else {
            self.stage = None;
            self.rescale = None;
            return;
        };
        if self.stage.as_ref().is_some_and(|(s, _)| *s == stage) {
            return;
        }
        // The stage's span closes before the next one opens.
        self.stage = None;
        let rescale = self
            .rescale
            .get_or_insert_with(|| debug_span!("rescale", epoch, node));
        let span = match stage {
            Stage::Stop => debug_span!(parent: &*rescale, "stop", epoch),
            Stage::Commit => debug_span!(parent: &*rescale, "commit", epoch),
            Stage::Reconcile => debug_span!(parent: &*rescale, "reconcile", epoch),
            other => debug_span!(parent: &*rescale, "stage", name = other.name(), epoch),
        };
        self.stage = Some((stage, span));
    }

    /// The span to log in now: the stage's (none outside a rescale).
    pub(crate) fn current(&self) -> Span {
        self.stage
            .as_ref()
            .map_or_else(Span::none, |(_, span)| span.clone())
    }

    /// The node's `rescale` span, the parent of its PEs' re-entry.
    pub(crate) fn rescale(&self) -> Span {
        self.rescale.clone().unwrap_or_else(Span::none)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::span::{Attributes, Id};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    use super::*;

    /// What the subscriber saw: spans (name, parent, fields) and events
    /// (message, the span they were logged in).
    #[derive(Clone, Default)]
    struct Seen {
        spans: Arc<Mutex<Vec<(String, Option<String>, String)>>>,
        events: Arc<Mutex<Vec<(String, Option<String>)>>>,
    }

    impl<S> Layer<S> for Seen
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let span = ctx.span(id).expect("a new span is registered");
            let parent = span.parent().map(|p| p.name().to_string());
            let mut fields = Vec::new();
            attrs.record(&mut |f: &tracing::field::Field, v: &dyn std::fmt::Debug| {
                fields.push(format!("{}={v:?}", f.name()));
            });
            self.spans.lock().expect("spans").push((
                span.name().to_string(),
                parent,
                fields.join(" "),
            ));
        }

        fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
            let mut message = String::new();
            event.record(&mut |f: &tracing::field::Field, v: &dyn std::fmt::Debug| {
                if f.name() == "message" {
                    message = format!("{v:?}");
                }
            });
            let at = ctx.event_span(event).map(|s| s.name().to_string());
            self.events.lock().expect("events").push((message, at));
        }
    }

    fn span(name: &str, parent: Option<&str>, fields: &str) -> (String, Option<String>, String) {
        (name.into(), parent.map(Into::into), fields.into())
    }

    #[test]
    fn one_rescale_is_one_tree_of_stage_spans_with_the_epoch() {
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry().with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            let mut spans = RescaleSpans::default();
            assert!(spans.current().is_none(), "no span outside a rescale");
            for stage in [Stage::Stop, Stage::Stop, Stage::Commit, Stage::Reconcile] {
                spans.follow(Some((stage, 7)), 2);
                spans
                    .current()
                    .in_scope(|| tracing::debug!("in {}", stage.name()));
            }
            // A PE's re-entry, as pe/reentry.rs opens it.
            let reentry = spans.rescale();
            spans.follow(None, 2);
            assert!(spans.current().is_none());
            let pe = debug_span!(parent: &reentry, "reentry", epoch = 7u64, pe = 5u32);
            pe.in_scope(|| tracing::debug!("re-entered"));
            // The next rescale is a tree of its own.
            spans.follow(Some((Stage::Stop, 8)), 1);
        });
        let spans = seen.spans.lock().expect("spans").clone();
        assert_eq!(
            spans,
            vec![
                span("rescale", None, "epoch=7 node=2"),
                span("stop", Some("rescale"), "epoch=7"),
                span("commit", Some("rescale"), "epoch=7"),
                span("reconcile", Some("rescale"), "epoch=7"),
                span("reentry", Some("rescale"), "epoch=7 pe=5"),
                span("rescale", None, "epoch=8 node=1"),
                span("stop", Some("rescale"), "epoch=8"),
            ]
        );
        let events = seen.events.lock().expect("events").clone();
        let at = |m: &str| {
            events
                .iter()
                .filter(|(msg, _)| msg == m)
                .map(|(_, at)| at.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(at("in stop"), vec![Some("stop".to_string()); 2]);
        assert_eq!(at("in commit"), vec![Some("commit".to_string())]);
        assert_eq!(at("in reconcile"), vec![Some("reconcile".to_string())]);
        assert_eq!(at("re-entered"), vec![Some("reentry".to_string())]);
    }
}
