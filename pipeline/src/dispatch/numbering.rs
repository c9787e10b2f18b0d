//! Attempt numbers: one sequence per delivery across automatic and manual
//! attempts, unique and increasing.
//!
//! What is recorded gives a lower bound (automatic + manual attempts so
//! far, [`DeliveryJob::next_auto_number`]; a replay's claim counts itself).
//! Attempts still in flight or not yet recorded are known only here, so
//! the dispatcher keeps, for each delivery it holds or is attempting, the
//! highest number it started; a new attempt takes the larger of the two.
//! Every attempt of a delivery goes through the node that holds it (replay
//! claims skip deliveries another live node holds), so one node's memory is
//! enough.

use std::collections::HashMap;

use crate::delivery::DeliveryJob;
use crate::ids::DeliveryId;

#[derive(Debug, Clone, Copy, Default)]
struct Started {
    last: u32,
    in_flight: u32,
    /// Replays accepted and not started: their numbers were taken from
    /// what was recorded at their claim, so what starts before them must
    /// stay remembered.
    expected: u32,
}

impl Started {
    fn idle(&self) -> bool {
        self.in_flight == 0 && self.expected == 0
    }
}

/// The highest number started per delivery, while it matters.
#[derive(Debug, Default)]
pub struct Numbering {
    started: HashMap<DeliveryId, Started>,
}

impl Numbering {
    /// Takes the number of the attempt of `job` about to start.
    pub fn start(&mut self, job: &DeliveryJob) -> u32 {
        let recorded = match job.replay {
            Some(r) => r.number,
            None => job.next_auto_number(),
        };
        let entry = self.started.entry(job.delivery_id).or_default();
        if job.replay.is_some() {
            entry.expected = entry.expected.saturating_sub(1);
        }
        let number = recorded.max(entry.last + 1);
        entry.last = number;
        entry.in_flight += 1;
        number
    }

    /// A replay of `delivery` was accepted: until it starts, the numbers
    /// started before it are remembered (its own number was counted at its
    /// claim, perhaps before an attempt in flight was recorded).
    pub fn expect(&mut self, delivery: DeliveryId) {
        self.started.entry(delivery).or_default().expected += 1;
    }

    /// An accepted replay of `delivery` will not start (refused).
    pub fn unexpect(&mut self, delivery: DeliveryId, still_held: bool) {
        if let Some(e) = self.started.get_mut(&delivery) {
            e.expected = e.expected.saturating_sub(1);
            if e.idle() && !still_held {
                self.started.remove(&delivery);
            }
        }
    }

    /// An attempt of `delivery` finished; `still_held` when the delivery
    /// stays in this node's schedule (its next number must follow).
    pub fn finish(&mut self, delivery: DeliveryId, still_held: bool) {
        if let Some(e) = self.started.get_mut(&delivery) {
            e.in_flight = e.in_flight.saturating_sub(1);
            if e.idle() && !still_held {
                // Everything started is now recorded (or on its way to the
                // recorder, ahead of any claim that could bring the
                // delivery back).
                self.started.remove(&delivery);
            }
        }
    }

    /// `delivery` left this node without an attempt (ended, handed back):
    /// nothing of it needs remembering unless an attempt is still out.
    pub fn forget(&mut self, delivery: DeliveryId) {
        if self.started.get(&delivery).is_some_and(Started::idle) {
            self.started.remove(&delivery);
        }
    }

    /// Deliveries tracked (tests, metrics).
    pub fn len(&self) -> usize {
        self.started.len()
    }

    /// Whether none is tracked.
    pub fn is_empty(&self) -> bool {
        self.started.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::Replay;
    use crate::dispatch::scheduler::tests::job;

    #[test]
    fn a_waiting_replay_does_not_reuse_the_number_of_an_attempt_that_ended_meanwhile() {
        // Seen in the console's browser test: five failed automatic
        // attempts, a replay claimed (its number counted as 6) that waits
        // behind the open circuit; the sixth automatic attempt goes first,
        // succeeds and ends the delivery; then the replay starts.
        let mut n = Numbering::default();
        let mut auto = job(1, 1, "acme", 0);
        auto.attempt_count = 5;
        let mut replay = auto.clone();
        replay.manual_attempt_count = 1;
        replay.replay = Some(Replay {
            request_id: 7,
            number: 6,
        });
        n.expect(replay.delivery_id);
        assert_eq!(n.start(&auto), 6);
        n.finish(auto.delivery_id, false);
        assert_eq!(
            n.start(&replay),
            7,
            "the replay reused the automatic attempt's number"
        );
        n.finish(replay.delivery_id, false);
        assert!(n.is_empty());
        // A refused replay lets go of the delivery too.
        n.expect(replay.delivery_id);
        n.unexpect(replay.delivery_id, false);
        assert!(n.is_empty());
    }

    #[test]
    fn automatic_and_manual_attempts_share_one_increasing_sequence() {
        let mut n = Numbering::default();
        let mut auto = job(1, 1, "acme", 0);
        auto.attempt_count = 2;
        // Attempt 3 goes out; a replay is claimed before it is recorded:
        // the claim only knows of 2 automatic attempts and itself.
        assert_eq!(n.start(&auto), 3);
        let mut replay = auto.clone();
        replay.manual_attempt_count = 1;
        replay.replay = Some(Replay {
            request_id: 9,
            number: 3,
        });
        assert_eq!(n.start(&replay), 4, "a replay reused a number in flight");
        n.finish(auto.delivery_id, true);
        n.finish(auto.delivery_id, true);
        // The held delivery's next automatic attempt follows both.
        auto.attempt_count = 3;
        assert_eq!(n.start(&auto), 5);
        n.finish(auto.delivery_id, false);
        assert!(n.is_empty());
        // After an unclean stop the next attempt skips the unknown one.
        auto.attempt_count = 4;
        auto.manual_attempt_count = 1;
        auto.after_unknown = true;
        assert_eq!(n.start(&auto), 7);
    }
}
