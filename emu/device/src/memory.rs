//! MR memory of one device as the engine reaches it: MR key index → [`Region`].
//!
//! Not the memory itself (that is [`mr_region`]) and not the key checks (the HCA validates
//! keys, bounds and access before it touches memory): a lookup from key to region.

use std::sync::Arc;

use emu_proto::{AtomicOp, Memory, MemoryFault};
use mr_region::Region;

/// MR memory of one device: MR key index (`lkey >> 8`) → region. The engine reads, writes and
/// runs atomics on it through [`emu_proto::Memory`].
///
/// The key index is the MR's slot in the HCA's MR table, whose slots are dense (a new slot only
/// when fewer than 65 freed ones wait for reuse), so the regions are a vector indexed by it, no
/// longer than that table: one bounds-checked load per access, where a hash map hashed the key
/// on every packet.
#[derive(Debug, Default)]
pub struct DeviceMemory {
    /// `regions[key >> 8]`; `None` for a slot without a registered MR.
    regions: Vec<Option<Arc<Region>>>,
}

impl DeviceMemory {
    /// Routes accesses with MR key `key` to `region` (replacing what routed the same key index).
    pub fn insert(&mut self, key: u32, region: Arc<Region>) {
        let slot = (key >> 8) as usize;
        if self.regions.len() <= slot {
            self.regions.resize(slot + 1, None);
        }
        self.regions[slot] = Some(region);
    }

    /// Stops routing MR key `key` (its key index).
    pub fn remove(&mut self, key: u32) {
        if let Some(slot) = self.regions.get_mut((key >> 8) as usize) {
            *slot = None;
        }
        while self.regions.last().is_some_and(Option::is_none) {
            self.regions.pop();
        }
    }

    fn region(&self, key: u32, offset: u64) -> Result<(&Region, usize), MemoryFault> {
        let region = self
            .regions
            .get((key >> 8) as usize)
            .and_then(Option::as_deref)
            .ok_or(MemoryFault)?;
        let offset = usize::try_from(offset).map_err(|_| MemoryFault)?;
        Ok((region, offset))
    }
}

impl Memory for DeviceMemory {
    fn read(&self, key: u32, offset: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        let (region, offset) = self.region(key, offset)?;
        region.read(offset, buf).map_err(|_| MemoryFault)
    }

    fn write(&self, key: u32, offset: u64, data: &[u8]) -> Result<(), MemoryFault> {
        let (region, offset) = self.region(key, offset)?;
        region.write(offset, data).map_err(|_| MemoryFault)
    }

    fn atomic(&self, key: u32, offset: u64, op: AtomicOp) -> Result<u64, MemoryFault> {
        let (region, offset) = self.region(key, offset)?;
        region
            .atomic(offset, |v| op.apply(v))
            .map_err(|_| MemoryFault)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn region(byte: u8) -> Arc<Region> {
        let r = Region::heap(16);
        r.write(0, &[byte; 16]).unwrap();
        Arc::new(r)
    }

    fn first_byte(mem: &DeviceMemory, key: u32) -> Result<u8, MemoryFault> {
        let mut b = [0u8; 1];
        mem.read(key, 0, &mut b).map(|()| b[0])
    }

    #[test]
    fn keys_route_by_index_and_removal_faults_only_that_index() {
        let mut mem = DeviceMemory::default();
        assert_eq!(first_byte(&mem, 0x0107), Err(MemoryFault));
        mem.insert(0x0107, region(1));
        mem.insert(0x0342, region(3));
        // The key byte does not select: the index does (the HCA checks the whole key).
        assert_eq!(first_byte(&mem, 0x01FF), Ok(1));
        assert_eq!(first_byte(&mem, 0x0300), Ok(3));
        assert_eq!(first_byte(&mem, 0x0200), Err(MemoryFault));
        assert_eq!(first_byte(&mem, 0x0400), Err(MemoryFault));
        mem.write(0x0342, 15, &[9]).unwrap();
        let mut b = [0u8; 2];
        mem.read(0x0342, 14, &mut b).unwrap();
        assert_eq!(b, [3, 9]);
        assert_eq!(mem.read(0x0342, 15, &mut b), Err(MemoryFault));
        assert_eq!(
            mem.atomic(0x0342, 0, AtomicOp::FetchAdd { add: 0 }),
            Ok(0x0303_0303_0303_0303)
        );

        mem.remove(0x0342);
        assert_eq!(first_byte(&mem, 0x0342), Err(MemoryFault));
        assert_eq!(first_byte(&mem, 0x0107), Ok(1));
        // A reused index routes to the new region; removing an unknown index changes nothing.
        mem.insert(0x0355, region(5));
        assert_eq!(first_byte(&mem, 0x0355), Ok(5));
        mem.remove(0x0900);
        mem.remove(0x0107);
        assert_eq!(first_byte(&mem, 0x0107), Err(MemoryFault));
        assert_eq!(first_byte(&mem, 0x0355), Ok(5));
        mem.remove(0x0355);
        assert!(mem.regions.is_empty());
    }
}
