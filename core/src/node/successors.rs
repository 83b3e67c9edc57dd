//! Successors: rows a node reserved to start the moment a step of the same
//! key ends, in the slot that step frees, without a round trip in between.
//! The database side (reservation, promotion, release) is in
//! `sql/functions/handoff.sql`; this is the node's bookkeeping.
//!
//! A successor belongs to its key *and queue*: it runs in a slot of its own
//! queue, on that queue's permits, and is reserved only for steps of the same
//! key in the same queue (the reservation query matches both).

use crate::outcome::Claimed;
use std::collections::{HashMap, VecDeque};

/// A key within one queue: what a successor is reserved for.
type Slot = (String, String);

fn slot(row: &Claimed) -> Option<Slot> {
    let k = row.concurrency_key.as_ref()?;
    Some((k.clone(), row.queue.clone()))
}

#[derive(Default)]
pub(crate) struct Successors {
    /// Rows of each key and queue this node holds claimed (running or about to).
    held: HashMap<Slot, usize>,
    /// Reserved rows per key and queue, in the order they were reserved.
    reserved: HashMap<Slot, VecDeque<Claimed>>,
    /// Reserved rows (id, reservation token) no step of their key is left to
    /// hand over to: to give back in the next handoff.
    dangling: Vec<(i64, i64)>,
    /// Counts the times a handoff reported a key of this node's steps free
    /// at its end (a slot credited back, nobody to hand it to), and the count
    /// at each key's latest such report: a reservation from a call that
    /// started before it is given back, as are those held then, so that a
    /// pick can admit their rows into the free slot.
    ends: u64,
    last_free: HashMap<String, u64>,
}

fn ids(q: VecDeque<Claimed>) -> impl Iterator<Item = (i64, i64)> {
    q.into_iter().map(|r| (r.id, r.token))
}

impl Successors {
    /// A claimed row is about to run.
    pub fn claimed(&mut self, row: &Claimed) {
        if let Some(s) = slot(row) {
            *self.held.entry(s).or_default() += 1;
        }
    }

    /// Call before a handoff; pass the result to `reserved`.
    pub fn mark(&self) -> u64 {
        self.ends
    }

    /// A reservation came back from a handoff that started at `mark`.
    pub fn reserved(&mut self, row: Claimed, mark: u64) {
        match slot(&row) {
            Some(s)
                if self.held.contains_key(&s)
                    && self.last_free.get(&s.0).is_none_or(|&at| at <= mark) =>
            {
                self.reserved.entry(s).or_default().push_back(row);
            }
            _ => self.dangling.push((row.id, row.token)),
        }
    }

    /// A step of `row` ended: the successor to start in its slot, if one is
    /// reserved, already carrying the attempt, shard and token its promotion
    /// gives it (its reservation's token is `token - 1`).
    pub fn next(&mut self, row: &Claimed) -> Option<Claimed> {
        let s = slot(row)?;
        let Some(mut next) = self.reserved.get_mut(&s).and_then(|q| q.pop_front()) else {
            self.release(row);
            return None;
        };
        if self.reserved.get(&s).is_some_and(|q| q.is_empty()) {
            self.reserved.remove(&s);
        }
        next.attempt += 1;
        next.token += 1;
        next.gate_shard = row.gate_shard;
        Some(next)
    }

    /// A handoff found `key` free at its end: no row took over the slot a
    /// step of it freed. Rows reserved for the key go back to the pick.
    pub fn freed(&mut self, key: &str) {
        let slots: Vec<Slot> = self.held.keys().filter(|s| s.0 == key).cloned().collect();
        if slots.is_empty() {
            return;
        }
        self.ends += 1;
        self.last_free.insert(key.to_owned(), self.ends);
        for s in slots {
            if let Some(q) = self.reserved.remove(&s) {
                self.dangling.extend(ids(q));
            }
        }
    }

    /// A claimed row is gone with no successor in its place.
    pub fn release(&mut self, row: &Claimed) {
        let Some(s) = slot(row) else {
            return;
        };
        match self.held.get_mut(&s) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.held.remove(&s);
                if !self.held.keys().any(|h| h.0 == s.0) {
                    self.last_free.remove(&s.0);
                }
                if let Some(q) = self.reserved.remove(&s) {
                    self.dangling.extend(ids(q));
                }
            }
        }
    }

    /// Whether this node knows of the reservation `id` under `token`.
    pub fn is_reserved(&self, id: i64, token: i64) -> bool {
        self.reserved
            .values()
            .flatten()
            .any(|r| r.id == id && r.token == token)
    }

    pub fn has_dangling(&self) -> bool {
        !self.dangling.is_empty()
    }

    pub fn take_dangling(&mut self) -> Vec<(i64, i64)> {
        std::mem::take(&mut self.dangling)
    }

    /// Give back these reservations in the next handoff (also those whose
    /// release failed).
    pub fn restore_dangling(&mut self, rows: Vec<(i64, i64)>) {
        self.dangling.extend(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, key: Option<&str>, shard: Option<i32>) -> Claimed {
        Claimed {
            id,
            workflow: "w".into(),
            step: "s".into(),
            state: serde_json::json!({}),
            queue: "default".into(),
            attempt: 0,
            max_attempts: 20,
            concurrency_key: key.map(Into::into),
            gate_shard: shard,
            rate_key: None,
            wake: None,
            token: 7,
        }
    }

    fn dangling(s: &mut Successors) -> Vec<i64> {
        s.take_dangling().into_iter().map(|(id, _)| id).collect()
    }

    #[test]
    fn a_successor_takes_the_slot_of_the_step_that_ended() {
        let mut s = Successors::default();
        let r = row(1, Some("api:1"), Some(3));
        s.claimed(&r);
        s.reserved(row(2, Some("api:1"), None), s.mark());
        let next = s.next(&r).expect("a successor");
        assert_eq!(
            (next.id, next.attempt, next.gate_shard, next.token),
            (2, 1, Some(3), 8)
        );
        // The successor holds the key now: its own end releases it.
        assert!(s.next(&next).is_none());
        assert!(!s.has_dangling());
        assert!(s.held.is_empty());
    }

    #[test]
    fn reservations_without_a_holder_are_given_back() {
        let mut s = Successors::default();
        s.reserved(row(5, Some("acct:1"), None), s.mark());
        let r = row(1, Some("acct:2"), None);
        s.claimed(&r);
        s.reserved(row(6, Some("acct:2"), None), s.mark());
        s.reserved(row(7, Some("acct:2"), None), s.mark());
        assert_eq!(s.next(&r).map(|n| n.id), Some(6));
        // The last holder of acct:2 ends without taking 7.
        s.release(&row(6, Some("acct:2"), None));
        assert_eq!(dangling(&mut s), vec![5, 7]);
        assert!(!s.has_dangling());
    }

    #[test]
    fn a_reservation_late_for_a_freed_slot_is_given_back() {
        let mut s = Successors::default();
        let (a, b) = (
            row(1, Some("api:1"), Some(0)),
            row(2, Some("api:1"), Some(1)),
        );
        s.claimed(&a);
        s.claimed(&b);
        // A ends with no successor; 5 is reserved for B meanwhile.
        assert!(s.next(&a).is_none());
        s.reserved(row(5, Some("api:1"), None), s.mark());
        // The call recording A's end finds its slot free at the end, while
        // another reserving call is in flight.
        let mark = s.mark();
        s.freed("api:1");
        s.reserved(row(3, Some("api:1"), None), mark);
        assert_eq!(dangling(&mut s), vec![5, 3]);
        // A reservation made after that end is kept for B.
        s.reserved(row(4, Some("api:1"), None), s.mark());
        assert_eq!(s.next(&b).map(|n| n.id), Some(4));
    }

    #[test]
    fn keyless_rows_have_no_successors() {
        let mut s = Successors::default();
        let r = row(1, None, None);
        s.claimed(&r);
        assert!(s.next(&r).is_none());
        assert!(s.held.is_empty());
    }

    #[test]
    fn a_successor_never_crosses_queues() {
        let mut s = Successors::default();
        let mut in_a = row(1, Some("api:1"), Some(0));
        in_a.queue = "a".into();
        let mut in_b = row(2, Some("api:1"), Some(1));
        in_b.queue = "b".into();
        s.claimed(&in_a);
        s.claimed(&in_b);
        let mut reserved_b = row(3, Some("api:1"), None);
        reserved_b.queue = "b".into();
        s.reserved(reserved_b, s.mark());
        // The step of queue a ends: queue b's reservation is not its to take.
        assert!(s.next(&in_a).is_none());
        assert!(!s.has_dangling());
        let next = s.next(&in_b).expect("queue b's successor");
        assert_eq!((next.id, next.queue.as_str()), (3, "b"));
    }
}
