//! Memory access as an argument: the engine reads and writes MR bytes only through this trait.
//!
//! The HCA resolves keys, checks PDs, rights and bounds against its MR table before it calls a
//! [`Memory`]; the implementation maps an MR key to the bytes it registered (a `Vec` in tests,
//! host memory in the drivers) and must still refuse any range outside that MR. The engine never
//! dereferences an address itself.

/// An access the memory refused (unknown key or a range outside the MR).
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("memory access outside a registered region")]
pub struct MemoryFault;

/// An atomic operation on 8 bytes (rc-transport.md §4.6). Values are host-native `u64`s, as
/// rxe operates on the target memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Store `swap` if the current value equals `compare`.
    CompareSwap {
        /// Value compared with.
        compare: u64,
        /// Value stored on equality.
        swap: u64,
    },
    /// Add `add`, wrapping.
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

/// Byte access to registered memory, by MR key and offset from the MR's start.
pub trait Memory {
    /// Copies `buf.len()` bytes at `offset` of MR `key` into `buf`.
    fn read(&self, key: u32, offset: u64, buf: &mut [u8]) -> Result<(), MemoryFault>;
    /// Copies `data` to `offset` of MR `key`.
    fn write(&self, key: u32, offset: u64, data: &[u8]) -> Result<(), MemoryFault>;
    /// Runs `op` atomically on the 8 bytes at `offset` of MR `key` (8-byte aligned) and returns
    /// the original value.
    fn atomic(&self, key: u32, offset: u64, op: AtomicOp) -> Result<u64, MemoryFault>;
}

/// Memory with no regions: every access faults. For HCAs that never touch memory (tests of the
/// control path, packet generators).
#[derive(Copy, Clone, Debug, Default)]
pub struct NoMemory;

impl Memory for NoMemory {
    fn read(&self, _: u32, _: u64, _: &mut [u8]) -> Result<(), MemoryFault> {
        Err(MemoryFault)
    }
    fn write(&self, _: u32, _: u64, _: &[u8]) -> Result<(), MemoryFault> {
        Err(MemoryFault)
    }
    fn atomic(&self, _: u32, _: u64, _: AtomicOp) -> Result<u64, MemoryFault> {
        Err(MemoryFault)
    }
}

impl AtomicOp {
    /// The value to store given the original one, or `None` to leave memory unchanged.
    pub fn apply(self, original: u64) -> Option<u64> {
        match self {
            AtomicOp::CompareSwap { compare, swap } => (original == compare).then_some(swap),
            AtomicOp::FetchAdd { add } => Some(original.wrapping_add(add)),
        }
    }
}
