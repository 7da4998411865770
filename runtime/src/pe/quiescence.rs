//! Quiescence detection: counting waves (Mattern's four-counter method).
//!
//! PE 0 sends a wave down the spanning tree; each PE reports, up the tree,
//! how many application messages it has sent and processed. Two
//! consecutive waves with equal, balanced totals mean no application
//! message is queued or in flight anywhere.

use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::{misrouted, Scheduler};
use crate::msg::CallbackSpec;
use crate::reduce::Value;
use crate::system::SysMsg;

/// Delay between quiescence-detection waves while the job is busy.
const QD_WAVE_GAP: Duration = Duration::from_micros(200);

/// A PE's counts and, on PE 0, the waves in progress.
#[derive(Default)]
pub(super) struct Quiescence {
    /// Application messages this PE sent.
    pub(super) created: u64,
    /// Application messages this PE ran.
    pub(super) processed: u64,
    /// Root only: callbacks waiting for quiescence.
    pub(super) callbacks: Vec<CallbackSpec>,
    pub(super) running: bool,
    pub(super) wave: u64,
    pub(super) previous: Option<(u64, u64)>,
    /// Root: when the next wave starts.
    pub(super) next_wave_at: Option<Instant>,
    /// The wave this PE is collecting: (wave, children pending, created, processed).
    pub(super) current: Option<(u64, usize, u64, u64)>,
}

impl Scheduler {
    pub(super) fn start_qd_wave(&mut self) {
        self.ctx.qd.wave += 1;
        let wave = self.ctx.qd.wave;
        self.ctx.send_sys(0, SysMsg::QdWave { wave });
    }

    pub(super) fn qd_report(&mut self) {
        let Some((wave, _, c, p)) = self.ctx.qd.current.take() else {
            return;
        };
        let created = c + self.ctx.qd.created;
        let processed = p + self.ctx.qd.processed;
        match self.ctx.topo.parent(self.ctx.pe) {
            Some(parent) => self.ctx.send_sys(
                parent,
                SysMsg::QdReport {
                    wave,
                    created,
                    processed,
                },
            ),
            None => {
                // Root: quiescent when two consecutive waves saw the same, balanced counts.
                let now = (created, processed);
                tracing::trace!(wave, created, processed, "quiescence wave");
                if created == processed && self.ctx.qd.previous == Some(now) {
                    debug!("quiescence detected after wave {wave}");
                    self.ctx.qd.running = false;
                    self.ctx.qd.previous = None;
                    for cb in std::mem::take(&mut self.ctx.qd.callbacks) {
                        self.ctx.deliver_callback(&cb, &Value::Unit);
                    }
                } else {
                    self.ctx.qd.previous = (created == processed).then_some(now);
                    self.ctx.qd.next_wave_at = Some(Instant::now() + QD_WAVE_GAP);
                }
            }
        }
    }

    /// The quiescence service's runtime messages.
    pub(super) fn on_quiescence(&mut self, msg: SysMsg) {
        let me = self.ctx.pe;
        match msg {
            SysMsg::QdStart { callback } => {
                self.ctx.qd.callbacks.push(callback);
                if !self.ctx.qd.running {
                    self.ctx.qd.running = true;
                    self.ctx.qd.previous = None;
                    self.start_qd_wave();
                }
            }
            SysMsg::QdWave { wave } => {
                let pending = self.ctx.topo.children(me).len();
                self.ctx.qd.current = Some((wave, pending, 0, 0));
                if pending == 0 {
                    self.qd_report();
                }
            }
            SysMsg::QdReport {
                wave,
                created,
                processed,
            } => match &mut self.ctx.qd.current {
                Some((w, pending, c, p)) if *w == wave && *pending > 0 => {
                    *pending -= 1;
                    *c += created;
                    *p += processed;
                    if *pending == 0 {
                        self.qd_report();
                    }
                }
                _ => warn!(
                    pe = me,
                    "ignoring a stray quiescence report for wave {wave}"
                ),
            },
            other => misrouted(me, "quiescence", &other),
        }
    }
}
