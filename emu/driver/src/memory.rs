//! MR memory of one device, as the engine reaches it: MR key index → region.
//!
//! The bytes live in [`Region`]s shared with emu-sim (its only `unsafe` module); this map only
//! routes the engine's accesses to them.

use std::collections::HashMap;
use std::sync::Arc;

use emu_proto::{AtomicOp, Memory, MemoryFault};
use emu_sim::internals::Region;

/// The regions of one device by key index (`lkey >> 8`).
#[derive(Debug, Default)]
pub(crate) struct DeviceMemory {
    regions: HashMap<u32, Arc<Region>>,
}

impl DeviceMemory {
    pub(crate) fn insert(&mut self, key: u32, region: Arc<Region>) {
        self.regions.insert(key >> 8, region);
    }

    pub(crate) fn remove(&mut self, key: u32) {
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
        region.atomic(offset, op).map_err(|_| MemoryFault)
    }
}
