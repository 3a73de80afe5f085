//! Memory behind hardware MRs: anonymous mappings owned by the MR, shared file mappings and
//! caller memory.
//!
//! The NIC reads and writes these bytes by DMA while the application may access them through
//! [`Region::read`]/[`Region::write`]; both copy with relaxed atomic byte accesses, so such
//! concurrent accesses are not data races in Rust's sense (as on any NIC, overlapping accesses
//! give unspecified bytes, never touch memory outside the region).

use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use memmap2::MmapMut;

/// What keeps a region's bytes alive.
#[derive(Debug)]
enum Backing {
    /// A private anonymous mapping (page-aligned, zeroed) owned by the MR.
    Anon(#[allow(dead_code)] MmapMut),
    /// A shared mapping of a file.
    File(#[allow(dead_code)] MmapMut),
    /// Caller memory registered with `reg_mr_raw`; the caller keeps it alive.
    Caller,
}

/// A byte range registered as an MR.
#[derive(Debug)]
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    _backing: Backing,
}

// SAFETY: the region hands out only copies made with atomic byte operations, so sharing it
// between threads cannot cause data races; the memory lives as long as the region (Anon, File)
// or as the caller promised in `reg_mr_raw`'s contract (Caller).
unsafe impl Send for Region {}
// SAFETY: as for Send: every access is an in-bounds atomic load or store.
unsafe impl Sync for Region {}

impl Region {
    /// `len` (> 0) zeroed, page-aligned bytes.
    pub(crate) fn anon(len: usize) -> io::Result<Region> {
        let mut map = MmapMut::map_anon(len)?;
        let ptr = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(Region {
            ptr,
            len,
            _backing: Backing::Anon(map),
        })
    }

    /// A shared, writable mapping of `path`, created if missing and grown to `len` (> 0) bytes.
    pub(crate) fn file(path: &Path, len: usize) -> io::Result<Region> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let wanted = u64::try_from(len).map_err(io::Error::other)?;
        if file.metadata()?.len() < wanted {
            file.set_len(wanted)?;
        }
        // SAFETY: the mapping is shared with other processes by design (that is what
        // `reg_mr_file` is for); our accesses are atomic byte copies, and a file truncated under
        // the mapping by another process is outside the documented contract.
        let mut map = unsafe { memmap2::MmapOptions::new().len(len).map_mut(&file)? };
        let ptr = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(Region {
            ptr,
            len,
            _backing: Backing::File(map),
        })
    }

    /// Caller memory.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be valid for reads and writes for the region's whole life (the
    /// contract of `Context::reg_mr_raw`).
    pub(crate) unsafe fn caller(ptr: NonNull<u8>, len: usize) -> Region {
        Region {
            ptr,
            len,
            _backing: Backing::Caller,
        }
    }

    /// The start address (the MR's virtual address).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn in_bounds(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`; false (nothing copied) if the range
    /// leaves the region.
    pub(crate) fn read(&self, offset: usize, buf: &mut [u8]) -> bool {
        if !self.in_bounds(offset, buf.len()) {
            return false;
        }
        for (i, out) in buf.iter_mut().enumerate() {
            // SAFETY: offset + i < len (checked above), so the byte lies inside the live region;
            // AtomicU8 has the size and alignment of u8.
            let byte = unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(offset + i)) };
            *out = byte.load(Ordering::Relaxed);
        }
        true
    }

    /// Copies `data` into the region at `offset`; false (nothing copied) if the range leaves
    /// the region.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> bool {
        if !self.in_bounds(offset, data.len()) {
            return false;
        }
        for (i, value) in data.iter().enumerate() {
            // SAFETY: as in `read`: the byte is inside the live region.
            let byte = unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(offset + i)) };
            byte.store(*value, Ordering::Relaxed);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn anon_is_zeroed_aligned_and_bounded() {
        let r = Region::anon(5000).unwrap();
        assert_eq!(r.as_ptr() as usize % 4096, 0);
        let mut b = [1u8; 8];
        assert!(r.read(4992, &mut b));
        assert_eq!(b, [0; 8]);
        assert!(r.write(10, b"abc"));
        let mut c = [0u8; 3];
        assert!(r.read(10, &mut c));
        assert_eq!(&c, b"abc");
        assert!(!r.write(4999, b"xy"));
        assert!(!r.read(usize::MAX, &mut c));
    }
}
