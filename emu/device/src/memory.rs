//! MR memory of one device as the engine reaches it: MR key index → [`Region`].
//!
//! Not the memory itself (that is [`mr_region`]) and not the key checks (the HCA validates
//! keys, bounds and access before it touches memory): a lookup from key to region.

use std::collections::HashMap;
use std::sync::Arc;

use emu_proto::{AtomicOp, Memory, MemoryFault};
use mr_region::Region;

/// MR memory of one device: MR key index (`lkey >> 8`) → region. The engine reads, writes and
/// runs atomics on it through [`emu_proto::Memory`].
#[derive(Debug, Default)]
pub struct DeviceMemory {
    regions: HashMap<u32, Arc<Region>>,
}

impl DeviceMemory {
    /// Routes accesses with MR key `key` to `region`.
    pub fn insert(&mut self, key: u32, region: Arc<Region>) {
        self.regions.insert(key >> 8, region);
    }

    /// Stops routing MR key `key`.
    pub fn remove(&mut self, key: u32) {
        self.regions.remove(&(key >> 8));
    }

    fn region(&self, key: u32, offset: u64) -> Result<(&Region, usize), MemoryFault> {
        let region = self.regions.get(&(key >> 8)).ok_or(MemoryFault)?;
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
