//! A slot table with stable `u32` indices, the storage behind every object kind of the HCA.
//!
//! Freed indices are reused in FIFO order and only once more than [`REUSE_AFTER`] are free, so a
//! just-destroyed object's number is not handed out again at once (a late packet for a
//! destroyed QP then finds nothing rather than a new QP).

use std::collections::VecDeque;

/// Freed indices wait until more than this many are free before reuse.
pub(crate) const REUSE_AFTER: usize = 64;

/// Slots addressed by index; `insert` is O(1), lookups are O(1).
#[derive(Clone, Debug)]
pub(crate) struct Table<T> {
    slots: Vec<Option<T>>,
    free: VecDeque<u32>,
    len: usize,
}

impl<T> Default for Table<T> {
    fn default() -> Table<T> {
        Table {
            slots: Vec::new(),
            free: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> Table<T> {
    /// Stores `value` and returns its index, or `None` when `u32` indices are exhausted.
    pub(crate) fn insert(&mut self, value: T) -> Option<u32> {
        let reuse = if self.free.len() > REUSE_AFTER {
            self.free.pop_front()
        } else {
            None
        };
        let index = match reuse {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len()).ok()?;
                self.slots.push(None);
                i
            }
        };
        let slot = self.slots.get_mut(index as usize)?;
        *slot = Some(value);
        self.len += 1;
        Some(index)
    }

    pub(crate) fn get(&self, index: u32) -> Option<&T> {
        self.slots.get(index as usize)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, index: u32) -> Option<&mut T> {
        self.slots.get_mut(index as usize)?.as_mut()
    }

    pub(crate) fn remove(&mut self, index: u32) -> Option<T> {
        let value = self.slots.get_mut(index as usize)?.take()?;
        self.free.push_back(index);
        self.len -= 1;
        Some(value)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Number of slots, occupied or not (indices are below it).
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reuses_indices_fifo() {
        let mut t = Table::default();
        let a = t.insert('a');
        let b = t.insert('b');
        assert_eq!((a, b), (Some(0), Some(1)));
        assert_eq!(t.remove(0), Some('a'));
        assert_eq!(t.remove(0), None);
        assert_eq!(t.insert('c'), Some(2));
        assert_eq!(t.len(), 2);
        for i in 0..REUSE_AFTER {
            let idx = t.insert('x').unwrap();
            t.remove(idx);
            assert_ne!(idx, 0, "index 0 reused after {i} frees");
        }
        assert_eq!(t.insert('d'), Some(0));
        assert_eq!(t.get(1), Some(&'b'));
        assert_eq!(t.get(7), None);
    }
}
