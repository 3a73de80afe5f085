//! `mr-region`: the memory behind an MR — heap buffers, anonymous and shared file mappings, and
//! caller memory — for every softverbs backend (the emulated devices of `emu-device` and the
//! hardware backend `verbs-hw`).
//!
//! This is the only `unsafe` MR-memory code of the workspace. Every access a peer, a NIC or
//! the application makes goes through [`Region::read`], [`Region::write`] and
//! [`Region::atomic`], which bounds-check against the region and copy with atomic loads and
//! stores. Atomic copies make concurrent access by the application, a peer, a NIC (DMA) and
//! another process (through a file mapping) free of data races in Rust's sense; as on
//! hardware, overlapping concurrent accesses give unspecified bytes but never touch memory
//! outside the region.
//!
//! It is not an allocator or a registration table: who owns which region and under which key
//! is the backend's business.
//!
//! The tests run under Miri (the file mapping test excepted: Miri cannot map a file):
//! `MIRIFLAGS=-Zmiri-disable-weak-memory-emulation cargo +nightly miri test -p mr-region`.
//! Miri's weak-memory emulation does not support the mixed-size atomic accesses the word
//! copies make (it stops with an internal error), hence the flag; Stacked Borrows and bounds
//! checks stay on.

use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use memmap2::MmapMut;

/// What keeps a region's bytes alive.
#[derive(Debug)]
enum Backing {
    /// Zeroed heap memory owned by the MR (8-byte aligned): a leaked `Box`, freed on drop. Kept
    /// as a raw pointer, not a `Box`, because moving a `Box` asserts unique access to its
    /// memory, which would invalidate the region's pointer into it.
    Heap(NonNull<[AtomicU64]>),
    /// A private anonymous mapping (page-aligned, zeroed) owned by the MR.
    Anon(#[allow(dead_code)] MmapMut),
    /// A shared mapping of a file.
    Map(#[allow(dead_code)] MmapMut),
    /// Caller memory registered with `reg_mr_raw`; the caller keeps it alive.
    Caller,
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Backing::Heap(words) = *self {
            // SAFETY: `words` came from `Box::leak` in `Region::heap` and is freed only here,
            // once; the region that pointed into it is being dropped.
            drop(unsafe { Box::from_raw(words.as_ptr()) });
        }
    }
}

/// A byte range that MR accesses may touch.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    _backing: Backing,
}

// SAFETY: the region only hands out copies made with atomic operations, so sharing it between
// threads cannot cause data races; the backing memory lives as long as the region (Heap, Anon, Map)
// or as the caller promised in `reg_mr_raw`'s contract (Caller).
unsafe impl Send for Region {}
// SAFETY: as for Send: all access is through atomic loads/stores within bounds.
unsafe impl Sync for Region {}

/// A range outside the region.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct OutOfBounds;

impl Region {
    /// `len` zeroed bytes on the heap; `len` must be non-zero.
    pub fn heap(len: usize) -> Region {
        let words: Box<[AtomicU64]> = (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        let words = NonNull::from(Box::leak(words));
        let ptr = words.cast::<u8>();
        Region {
            ptr,
            len,
            _backing: Backing::Heap(words),
        }
    }

    /// `len` (> 0) zeroed, page-aligned bytes of a private anonymous mapping.
    pub fn anon(len: usize) -> io::Result<Region> {
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
    pub fn file(path: &Path, len: usize) -> io::Result<Region> {
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
        // SAFETY: the mapping is shared with other processes by design; every access we make
        // goes through atomic operations (see the module docs), and a file truncated under us
        // by another process is outside the contract `reg_mr_file` documents.
        let mut map = unsafe { memmap2::MmapOptions::new().len(len).map_mut(&file)? };
        let ptr = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(Region {
            ptr,
            len,
            _backing: Backing::Map(map),
        })
    }

    /// Caller memory.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be valid for reads and writes for the region's whole life
    /// (the contract of `Context::reg_mr_raw`).
    pub unsafe fn caller(ptr: NonNull<u8>, len: usize) -> Region {
        Region {
            ptr,
            len,
            _backing: Backing::Caller,
        }
    }

    /// The region's start address, used as the MR's virtual address.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The region's start as a pointer (what a NIC registration is given).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region (never made by this crate).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfBounds),
        }
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`: bytes up to the first 8-byte boundary,
    /// then whole aligned words, then the rest (a tight word loop: this is every packet's copy).
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), OutOfBounds> {
        self.check(offset, buf.len())?;
        // SAFETY: offset + buf.len() <= self.len (checked above), so `base` and the `buf.len()`
        // bytes after it lie inside the live region.
        let base = unsafe { self.ptr.as_ptr().add(offset) };
        let head = ((8 - base as usize % 8) % 8).min(buf.len());
        let (head_buf, rest) = buf.split_at_mut(head);
        let words = rest.len() / 8;
        let (body, tail) = rest.split_at_mut(words * 8);
        for (k, b) in head_buf.iter_mut().enumerate() {
            // SAFETY: k < head <= buf.len(): inside the region; AtomicU8 has u8's layout.
            *b = unsafe { AtomicU8::from_ptr(base.add(k)) }.load(Ordering::Relaxed);
        }
        // SAFETY: base + head is 8-byte aligned and inside (or one past) the region.
        let word_base = unsafe { base.add(head) }.cast::<u64>();
        for (k, chunk) in body.chunks_exact_mut(8).enumerate() {
            // SAFETY: word k covers bytes head + 8k .. head + 8k + 8 <= buf.len() of the range
            // checked above; aligned; every access to region memory is atomic.
            let w = unsafe { AtomicU64::from_ptr(word_base.add(k)) }.load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        let tail_at = head + words * 8;
        for (k, b) in tail.iter_mut().enumerate() {
            // SAFETY: tail_at + k < buf.len(): inside the checked range.
            *b = unsafe { AtomicU8::from_ptr(base.add(tail_at + k)) }.load(Ordering::Relaxed);
        }
        Ok(())
    }

    /// Copies `data` into the region at `offset` (head bytes, aligned words, tail bytes, as
    /// [`Region::read`]).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        self.check(offset, data.len())?;
        // SAFETY: offset + data.len() <= self.len (checked above): the range is inside the
        // live region.
        let base = unsafe { self.ptr.as_ptr().add(offset) };
        let head = ((8 - base as usize % 8) % 8).min(data.len());
        let (head_data, rest) = data.split_at(head);
        let words = rest.len() / 8;
        let (body, tail) = rest.split_at(words * 8);
        for (k, b) in head_data.iter().enumerate() {
            // SAFETY: k < head <= data.len(): inside the region.
            unsafe { AtomicU8::from_ptr(base.add(k)) }.store(*b, Ordering::Relaxed);
        }
        // SAFETY: base + head is 8-byte aligned and inside (or one past) the region.
        let word_base = unsafe { base.add(head) }.cast::<u64>();
        for (k, chunk) in body.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            // SAFETY: as in `read`: 8 aligned bytes inside the checked range, atomically.
            unsafe { AtomicU64::from_ptr(word_base.add(k)) }
                .store(u64::from_ne_bytes(w), Ordering::Relaxed);
        }
        let tail_at = head + words * 8;
        for (k, b) in tail.iter().enumerate() {
            // SAFETY: tail_at + k < data.len(): inside the checked range.
            unsafe { AtomicU8::from_ptr(base.add(tail_at + k)) }.store(*b, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Region {
    /// Runs `op` atomically on the 8 bytes at `offset`, which must be 8-byte aligned in memory:
    /// `op` maps the current value to the one to store (`None`: store nothing, as a failed
    /// compare-and-swap); it may run more than once under contention. Returns the original
    /// value.
    pub fn atomic(
        &self,
        offset: usize,
        op: impl Fn(u64) -> Option<u64>,
    ) -> Result<u64, OutOfBounds> {
        self.check(offset, 8)?;
        // SAFETY: offset + 8 <= len (checked), so the pointer stays inside the live region.
        let ptr = unsafe { self.ptr.as_ptr().add(offset) };
        if ptr as usize % 8 != 0 {
            return Err(OutOfBounds);
        }
        // SAFETY: the 8 bytes are inside the region and 8-byte aligned (checked above), and all
        // other accesses to them are atomic too.
        let word = unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) };
        let mut current = word.load(Ordering::SeqCst);
        loop {
            let Some(new) = op(current) else {
                return Ok(current);
            };
            match word.compare_exchange_weak(current, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(orig) => return Ok(orig),
                Err(actual) => current = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn heap_region_bounds() {
        let r = Region::heap(13);
        assert_eq!(r.len(), 13);
        assert_eq!(r.addr() % 8, 0);
        r.write(5, &[1, 2, 3]).unwrap();
        let mut buf = [0u8; 4];
        r.read(4, &mut buf).unwrap();
        assert_eq!(buf, [0, 1, 2, 3]);
        assert_eq!(r.write(12, &[1, 2]), Err(OutOfBounds));
        assert_eq!(r.read(usize::MAX, &mut buf), Err(OutOfBounds));
        assert_eq!(r.read(13, &mut []), Ok(()));
    }

    #[test]
    fn word_and_byte_copies_agree_at_every_alignment() {
        let r = Region::heap(256);
        let data: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(37)).collect();
        for off in 0..16 {
            r.write(off, &data).unwrap();
            for start in 0..9 {
                let mut got = vec![0u8; data.len() - start];
                r.read(off + start, &mut got).unwrap();
                assert_eq!(got, data[start..], "offset {off}, start {start}");
            }
            // Short copies: all head, head + tail, exactly one word.
            for len in 0..20 {
                r.write(off + 100, &data[..len]).unwrap();
                let mut got = vec![0u8; len];
                r.read(off + 100, &mut got).unwrap();
                assert_eq!(got, data[..len], "offset {off}, len {len}");
            }
        }
        assert_eq!(r.write(250, &data[..7]), Err(OutOfBounds));
        assert_eq!(r.read(256, &mut [0u8; 1]), Err(OutOfBounds));
    }

    #[test]
    fn atomics_need_alignment_and_bounds() {
        let r = Region::heap(16);
        let add = |v: u64| Some(v.wrapping_add(5));
        assert_eq!(r.atomic(8, add), Ok(0));
        assert_eq!(r.atomic(8, add), Ok(5));
        let cas = |v: u64| (v == 10).then_some(1);
        assert_eq!(r.atomic(8, cas), Ok(10));
        assert_eq!(r.atomic(8, cas), Ok(1));
        assert_eq!(r.atomic(4, add), Err(OutOfBounds));
        assert_eq!(r.atomic(16, add), Err(OutOfBounds));
    }

    #[test]
    fn anon_is_zeroed_aligned_and_bounded() {
        let r = Region::anon(5000).unwrap();
        assert_eq!(r.as_ptr() as usize % 4096, 0);
        let mut b = [1u8; 8];
        r.read(4992, &mut b).unwrap();
        assert_eq!(b, [0; 8]);
        r.write(10, b"abc").unwrap();
        let mut c = [0u8; 3];
        r.read(10, &mut c).unwrap();
        assert_eq!(&c, b"abc");
        assert_eq!(r.write(4999, b"xy"), Err(OutOfBounds));
        assert_eq!(r.read(usize::MAX, &mut c), Err(OutOfBounds));
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri cannot map a file")]
    fn file_region_is_shared() {
        let dir = std::env::temp_dir().join(format!("softverbs-region-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mr.bin");
        let r = Region::file(&path, 64).unwrap();
        r.write(10, b"hello").unwrap();
        drop(r);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 64);
        assert_eq!(&bytes[10..15], b"hello");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
