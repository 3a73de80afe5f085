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
//! # One access size per byte
//!
//! Rust's memory model leaves mixed-size atomic accesses to the same bytes undefined, so
//! every byte of a region has one access size, whatever the copy: the bytes of each aligned
//! 8-byte word that lies entirely inside the region (a *whole word*) are only ever accessed
//! as that one `AtomicU64` — a copy that needs some of its bytes loads the word, or updates
//! it with a compare-and-swap loop that keeps the others; the at most 7 bytes at each end of
//! the region outside every whole word (its *edge bytes*) are only ever accessed as
//! `AtomicU8`. FETCH_ADD and compare-and-swap ([`Region::atomic`]) need an aligned word, so
//! they act on whole words only. On x86-64 a copy moves the whole words of each 16-byte
//! aligned pair with one aligned 16-byte SSE access in inline assembly where the processor
//! guarantees such an access atomic (those with AVX), so each of its quadwords is accessed
//! as one atomic word, as every other copy does (see `sse_load`; under Miri, which cannot
//! run assembly, the word loop runs instead). Other code that touches the same memory
//! concurrently (the owner of caller memory, another process mapping the file) must keep to
//! the same sizes.
//!
//! It is not an allocator or a registration table: who owns which region and under which key
//! is the backend's business.
//!
//! The tests run under Miri, weak-memory emulation included (the file mapping tests
//! excepted: Miri cannot map a file): `cargo +nightly miri test -p mr-region`
//! (`scripts/miri.sh`).

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
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

    /// A shared, writable mapping of `path`, created if missing (mode 0600: it holds
    /// application data) and grown to `len` (> 0) bytes.
    ///
    /// Contract (the one `Context::reg_mr_file` passes on): the file keeps at least `len`
    /// bytes while the region lives. If any process shrinks it, every later access to the
    /// pages past the new end raises SIGBUS, which kills this process: the region does not
    /// catch it (a signal handler cannot make the access return). Other processes may read and
    /// write the bytes, keeping to the access sizes of the module docs when concurrent.
    pub fn file(path: &Path, len: usize) -> io::Result<Region> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let wanted = u64::try_from(len).map_err(io::Error::other)?;
        if file.metadata()?.len() < wanted {
            file.set_len(wanted)?;
        }
        // SAFETY: the mapping is shared with other processes by design; every access we make
        // goes through atomic operations (see the module docs); a file truncated under us is
        // outside the contract documented above (it raises SIGBUS, never a silent wild access).
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

    /// The offsets `[lo, hi)` of the region's whole words: the aligned 8-byte words that lie
    /// entirely inside it. The bytes before `lo` and from `hi` on (at most 7 at each end) are
    /// its edge bytes.
    fn word_span(&self) -> (usize, usize) {
        let lo = ((8 - self.ptr.as_ptr() as usize % 8) % 8).min(self.len);
        (lo, lo + (self.len - lo) / 8 * 8)
    }

    /// The piece of a copy at `pos` (of the region) that ends before `end`: one edge byte, or
    /// the bytes of one whole word from `pos` on (all 8 when aligned and room is left).
    fn piece(&self, (lo, hi): (usize, usize), pos: usize, end: usize) -> Piece {
        if pos < lo || pos >= hi {
            return Piece::Byte;
        }
        let word = lo + (pos - lo) / 8 * 8;
        let within = pos - word;
        Piece::Word {
            word,
            within,
            n: (8 - within).min(end - pos),
        }
    }

    /// The atomic byte at `offset`, an edge byte (outside every whole word).
    ///
    /// # Safety
    ///
    /// `offset < self.len`.
    unsafe fn edge_byte(&self, offset: usize) -> &AtomicU8 {
        // SAFETY: offset < len (the caller's promise): inside the live region; AtomicU8 has
        // u8's layout; edge bytes are only ever accessed as AtomicU8 (see `word_span`).
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(offset)) }
    }

    /// The atomic whole word at `word`, an offset from `word_span`'s range, 8 apart from `lo`.
    ///
    /// # Safety
    ///
    /// `lo <= word` and `word + 8 <= hi` for `(lo, hi) = self.word_span()`, `word - lo` a
    /// multiple of 8.
    unsafe fn whole_word(&self, word: usize) -> &AtomicU64 {
        // SAFETY: the 8 bytes are inside the region and 8-byte aligned (the caller's promise);
        // whole words are only ever accessed as AtomicU64 (see `word_span`).
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(word).cast::<u64>()) }
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`, with one access size per byte: each
    /// whole word of the region is loaded as one `AtomicU64` (also for a copy that needs only
    /// some of its bytes), each edge byte as one `AtomicU8`. A tight word loop in the middle:
    /// this is every packet's copy.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), OutOfBounds> {
        self.check(offset, buf.len())?;
        let span = self.word_span();
        let end = offset + buf.len();
        let mut pos = offset;
        while pos < end {
            let at = pos - offset;
            match self.piece(span, pos, end) {
                Piece::Byte => {
                    // SAFETY: pos < end <= len (checked above).
                    buf[at] = unsafe { self.edge_byte(pos) }.load(Ordering::Relaxed);
                    pos += 1;
                }
                Piece::Word {
                    word,
                    within: 0,
                    n: 8,
                } => {
                    // The tight loop: every whole word from here that the copy covers.
                    let words = (end.min(span.1) - word) / 8;
                    self.load_words(word, &mut buf[at..at + words * 8]);
                    pos += words * 8;
                }
                Piece::Word { word, within, n } => {
                    // SAFETY: `piece` returned a whole word of `word_span`.
                    let w = unsafe { self.whole_word(word) }.load(Ordering::Relaxed);
                    buf[at..at + n].copy_from_slice(&w.to_ne_bytes()[within..within + n]);
                    pos += n;
                }
            }
        }
        Ok(())
    }

    /// Copies `data` into the region at `offset`, with the access sizes of [`Region::read`]:
    /// a whole word the copy covers is stored as one `AtomicU64`; one it covers in part (at
    /// most one at each end of the copy) is updated with a compare-and-swap loop that keeps
    /// its other bytes; edge bytes are stored as `AtomicU8`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        self.check(offset, data.len())?;
        let span = self.word_span();
        let end = offset + data.len();
        let mut pos = offset;
        while pos < end {
            let at = pos - offset;
            match self.piece(span, pos, end) {
                Piece::Byte => {
                    // SAFETY: pos < end <= len (checked above).
                    unsafe { self.edge_byte(pos) }.store(data[at], Ordering::Relaxed);
                    pos += 1;
                }
                Piece::Word {
                    word,
                    within: 0,
                    n: 8,
                } => {
                    // The tight loop: every whole word from here that the copy covers.
                    let words = (end.min(span.1) - word) / 8;
                    self.store_words(word, &data[at..at + words * 8]);
                    pos += words * 8;
                }
                Piece::Word { word, within, n } => {
                    // SAFETY: `piece` returned a whole word of `word_span`.
                    let cell = unsafe { self.whole_word(word) };
                    // Part of a word: keep its other bytes, whoever writes them meanwhile.
                    let part = &data[at..at + n];
                    let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                        let mut w = old.to_ne_bytes();
                        w[within..within + n].copy_from_slice(part);
                        Some(u64::from_ne_bytes(w))
                    });
                    pos += n;
                }
            }
        }
        Ok(())
    }
}

impl Region {
    /// How a copy of `len` bytes (a multiple of 8) of whole words from offset `word` on splits:
    /// `(words, blocks)`, the bytes copied word by word first (one word when the second word is
    /// the first 16-byte aligned one), then the bytes copied in aligned 16-byte blocks (none
    /// where [`block_copies`] does not hold, and under Miri); the rest goes word by word.
    fn block_split(&self, word: usize, len: usize) -> (usize, usize) {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if block_copies() {
            let lead = if (self.ptr.as_ptr() as usize + word) % 16 == 0 {
                0
            } else {
                8.min(len)
            };
            return (lead, (len - lead) / 16 * 16);
        }
        let _ = (word, len);
        (len, 0)
    }

    /// Loads the whole words from offset `word` on into `out` (a multiple of 8 bytes long),
    /// each as one relaxed `AtomicU64` load, or on x86-64 two at a time with one aligned
    /// 16-byte load ([`Region::block_split`], [`sse_load`]).
    ///
    /// The caller keeps `word` a whole word of `word_span` and `word + out.len()` at most the
    /// span's end.
    fn load_words(&self, word: usize, out: &mut [u8]) {
        let (lead, blocks) = self.block_split(word, out.len());
        let (lead_out, rest) = out.split_at_mut(lead);
        let (block_out, tail_out) = rest.split_at_mut(blocks);
        for (k, chunk) in lead_out.chunks_exact_mut(8).enumerate() {
            self.load_word(word + 8 * k, chunk);
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: `block_split` returns blocks only where `block_copies` holds, from the first
        // 16-byte aligned word on; those are whole words (the caller's promise) and
        // `block_out` is exactly as long.
        unsafe {
            sse_load(self.ptr.as_ptr().add(word + lead), block_out);
        }
        for (k, chunk) in tail_out.chunks_exact_mut(8).enumerate() {
            self.load_word(word + lead + blocks + 8 * k, chunk);
        }
    }

    /// Stores `data` (a multiple of 8 bytes long) into the whole words from offset `word` on,
    /// as [`Region::load_words`] loads them ([`sse_store`] for the blocks). The caller's
    /// promise is `load_words`'.
    fn store_words(&self, word: usize, data: &[u8]) {
        let (lead, blocks) = self.block_split(word, data.len());
        let (lead_data, rest) = data.split_at(lead);
        let (block_data, tail_data) = rest.split_at(blocks);
        for (k, chunk) in lead_data.chunks_exact(8).enumerate() {
            self.store_word(word + 8 * k, chunk);
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: as in `load_words`: blocks from the first aligned whole word, `block_data`
        // exactly as long.
        unsafe {
            sse_store(self.ptr.as_ptr().add(word + lead), block_data);
        }
        for (k, chunk) in tail_data.chunks_exact(8).enumerate() {
            self.store_word(word + lead + blocks + 8 * k, chunk);
        }
    }

    /// One whole word at `word` into `out` (8 bytes).
    #[inline(always)]
    fn load_word(&self, word: usize, out: &mut [u8]) {
        // SAFETY: a whole word of `word_span` (the callers' promise).
        let w = unsafe { self.whole_word(word) }.load(Ordering::Relaxed);
        out.copy_from_slice(&w.to_ne_bytes());
    }

    /// `data` (8 bytes) into the whole word at `word`.
    #[inline(always)]
    fn store_word(&self, word: usize, data: &[u8]) {
        let mut w = [0u8; 8];
        w.copy_from_slice(data);
        // SAFETY: a whole word of `word_span` (the callers' promise).
        unsafe { self.whole_word(word) }.store(u64::from_ne_bytes(w), Ordering::Relaxed);
    }
}

/// Whether this processor makes an aligned 16-byte `MOVDQA` one atomic access: Intel's SDM
/// (vol. 3A, "Guaranteed Atomic Operations") guarantees it for every processor that
/// enumerates AVX, and says that without that an SSE access wider than a quadword may be
/// split into several accesses. Without it every copy runs the word loop.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline]
fn block_copies() -> bool {
    std::arch::is_x86_feature_detected!("avx")
}

/// Copies `out.len() / 16` aligned 16-byte blocks of region memory from `src` into `out`.
///
/// Why this is not a mixed-size access: every byte it reads belongs to a whole word, which
/// every other access in this crate makes as one `AtomicU64`, and on a processor where
/// [`block_copies`] holds an aligned 16-byte `MOVDQA` is one atomic access, so it reads each of
/// its two quadwords single-copy atomically — what the two relaxed `AtomicU64` loads of the
/// word loop would read. The inline assembly is opaque to the compiler, so it cannot be
/// compiled as a non-atomic read that races; Miri cannot run it and runs the word loop.
///
/// # Safety
///
/// [`block_copies`] holds; `src` is 16-byte aligned, and `src..src + out.len()` lies in one
/// live region, all of it whole words (see [`Region::word_span`]); `out.len()` is a multiple
/// of 16.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline]
#[allow(unsafe_code)]
unsafe fn sse_load(src: *const u8, out: &mut [u8]) {
    let blocks = out.len() / 16;
    if blocks == 0 {
        return;
    }
    // SAFETY: `blocks` > 0 aligned 16-byte loads from `src` stay inside the region (the
    // caller's promise); the stores go to `out`, which is exactly `16 * blocks` bytes long
    // (unaligned stores, `movdqu`). No stack use; only the named registers change.
    unsafe {
        std::arch::asm!(
            // Four blocks per round while four are left, then one per round.
            "cmp {n}, 4",
            "jb 3f",
            "2:",
            "movdqa {a}, xmmword ptr [{src}]",
            "movdqa {b}, xmmword ptr [{src} + 16]",
            "movdqa {c}, xmmword ptr [{src} + 32]",
            "movdqa {d}, xmmword ptr [{src} + 48]",
            "movdqu xmmword ptr [{dst}], {a}",
            "movdqu xmmword ptr [{dst} + 16], {b}",
            "movdqu xmmword ptr [{dst} + 32], {c}",
            "movdqu xmmword ptr [{dst} + 48], {d}",
            "add {src}, 64",
            "add {dst}, 64",
            "sub {n}, 4",
            "cmp {n}, 4",
            "jae 2b",
            "3:",
            "test {n}, {n}",
            "jz 5f",
            "4:",
            "movdqa {a}, xmmword ptr [{src}]",
            "movdqu xmmword ptr [{dst}], {a}",
            "add {src}, 16",
            "add {dst}, 16",
            "dec {n}",
            "jnz 4b",
            "5:",
            src = inout(reg) src => _,
            dst = inout(reg) out.as_mut_ptr() => _,
            n = inout(reg) blocks => _,
            a = out(xmm_reg) _,
            b = out(xmm_reg) _,
            c = out(xmm_reg) _,
            d = out(xmm_reg) _,
            options(nostack),
        );
    }
}

/// Copies `data` (a multiple of 16 bytes long) into aligned 16-byte blocks of region memory
/// from `dst` on: each of a block's two aligned quadwords is stored single-copy atomically,
/// as [`sse_load`] explains for loads, so it is the word loop's pair of relaxed `AtomicU64`
/// stores.
///
/// # Safety
///
/// As [`sse_load`], for `dst` and `data`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline]
#[allow(unsafe_code)]
unsafe fn sse_store(dst: *mut u8, data: &[u8]) {
    let blocks = data.len() / 16;
    if blocks == 0 {
        return;
    }
    // SAFETY: `blocks` > 0 unaligned loads from `data` (exactly `16 * blocks` bytes) and
    // aligned 16-byte stores inside the region (the caller's promise). No stack use.
    unsafe {
        std::arch::asm!(
            // Four blocks per round while four are left, then one per round.
            "cmp {n}, 4",
            "jb 3f",
            "2:",
            "movdqu {a}, xmmword ptr [{src}]",
            "movdqu {b}, xmmword ptr [{src} + 16]",
            "movdqu {c}, xmmword ptr [{src} + 32]",
            "movdqu {d}, xmmword ptr [{src} + 48]",
            "movdqa xmmword ptr [{dst}], {a}",
            "movdqa xmmword ptr [{dst} + 16], {b}",
            "movdqa xmmword ptr [{dst} + 32], {c}",
            "movdqa xmmword ptr [{dst} + 48], {d}",
            "add {src}, 64",
            "add {dst}, 64",
            "sub {n}, 4",
            "cmp {n}, 4",
            "jae 2b",
            "3:",
            "test {n}, {n}",
            "jz 5f",
            "4:",
            "movdqu {a}, xmmword ptr [{src}]",
            "movdqa xmmword ptr [{dst}], {a}",
            "add {src}, 16",
            "add {dst}, 16",
            "dec {n}",
            "jnz 4b",
            "5:",
            src = inout(reg) data.as_ptr() => _,
            dst = inout(reg) dst => _,
            n = inout(reg) blocks => _,
            a = out(xmm_reg) _,
            b = out(xmm_reg) _,
            c = out(xmm_reg) _,
            d = out(xmm_reg) _,
            options(nostack),
        );
    }
}

/// One step of a copy: see [`Region::piece`].
enum Piece {
    /// One edge byte.
    Byte,
    /// `n` bytes of the whole word at offset `word`, from byte `within` of it.
    Word {
        word: usize,
        within: usize,
        n: usize,
    },
}

impl Region {
    /// Runs `op` atomically on the 8 bytes at `offset`, which must be 8-byte aligned in memory
    /// (so they are one of the region's whole words, accessed as `AtomicU64` by every copy
    /// too): `op` maps the current value to the one to store (`None`: store nothing, as a
    /// failed compare-and-swap); it may run more than once under contention. Returns the
    /// original value.
    pub fn atomic(
        &self,
        offset: usize,
        op: impl Fn(u64) -> Option<u64>,
    ) -> Result<u64, OutOfBounds> {
        self.check(offset, 8)?;
        let (lo, _) = self.word_span();
        if offset < lo || (offset - lo) % 8 != 0 {
            return Err(OutOfBounds);
        }
        // SAFETY: offset + 8 <= len (checked) and offset is lo + 8k: a whole word.
        let word = unsafe { self.whole_word(offset) };
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
    fn long_copies_keep_every_byte_and_touch_nothing_else() {
        // The block copies (four 16-byte blocks per round, then single blocks, with a word
        // before and after them) at every start within two blocks and lengths around the
        // round size, checked byte for byte, the bytes around each copy untouched.
        // Miri runs the word loop only (it cannot run the assembly), slowly: a few cases.
        let (starts, lens): (usize, &[usize]) = if cfg!(miri) {
            (9, &[16, 24, 65])
        } else {
            (32, &[16, 24, 63, 64, 65, 80, 127, 200, 4096, 4096 + 40])
        };
        let longest = lens.iter().copied().max().unwrap_or(0);
        let r = Region::heap(longest + starts + 8);
        let data: Vec<u8> = (0..longest).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..starts {
            for &len in lens {
                let fill = vec![0xA5u8; r.len()];
                r.write(0, &fill).unwrap();
                r.write(off, &data[..len]).unwrap();
                let mut got = vec![0u8; r.len()];
                r.read(0, &mut got).unwrap();
                assert_eq!(got[off..off + len], data[..len], "offset {off}, len {len}");
                assert!(
                    got[..off].iter().all(|&b| b == 0xA5),
                    "before {off}, len {len}"
                );
                assert!(
                    got[off + len..].iter().all(|&b| b == 0xA5),
                    "after {off}, len {len}"
                );
                // Reads starting at the copy's start, into an unaligned buffer.
                let mut out = vec![0u8; len + 3];
                r.read(off, &mut out[3..]).unwrap();
                assert_eq!(out[3..], data[..len], "read at {off}, len {len}");
            }
        }
    }

    #[test]
    fn an_unaligned_caller_region_copies_edge_bytes_and_words_alike() {
        // 8 words of caller memory; the region starts 3 bytes in and ends 5 bytes early.
        let words: Box<[AtomicU64]> = (0..8).map(|_| AtomicU64::new(0)).collect();
        let base = NonNull::from(&*words).cast::<u8>();
        // SAFETY: bytes 3..59 of `words` live until the end of the test, after `r`.
        let r = unsafe { Region::caller(base.add(3), 56) };
        assert_eq!(r.word_span(), (5, 53));
        let data: Vec<u8> = (0..56u8)
            .map(|b| b.wrapping_mul(29).wrapping_add(1))
            .collect();
        for off in 0..12 {
            for len in [0, 1, 2, 5, 8, 9, 17, 56 - off] {
                r.write(off, &data[..len]).unwrap();
                let mut got = vec![0u8; len];
                r.read(off, &mut got).unwrap();
                assert_eq!(got, data[..len], "offset {off}, len {len}");
            }
        }
        // Only whole words take atomics: offset 5 is the first, 53 is past the last.
        assert!(r.atomic(5, Some).is_ok());
        assert_eq!(r.atomic(0, Some), Err(OutOfBounds));
        assert_eq!(r.atomic(45, Some).map(|_| ()), Ok(()));
        assert_eq!(r.atomic(53, Some), Err(OutOfBounds));
        drop(r);
        // Nothing outside the region was touched.
        let first = words[0].load(Ordering::Relaxed).to_ne_bytes();
        assert_eq!(first[..3], [0, 0, 0]);
        let last = words[7].load(Ordering::Relaxed).to_ne_bytes();
        assert_eq!(last[3..], [0; 5]);
    }

    #[test]
    fn racing_copies_and_atomics_on_the_same_bytes_are_data_race_free() {
        // Under Miri, this is the test that would report a data race or a mixed-size access.
        let r = std::sync::Arc::new(Region::heap(67));
        let rounds = if cfg!(miri) { 4 } else { 1000 };
        let writer = {
            let r = r.clone();
            std::thread::spawn(move || {
                for k in 0..rounds {
                    r.write(3, &[k as u8; 60]).unwrap();
                }
            })
        };
        let adder = {
            let r = r.clone();
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    r.atomic(16, |v| Some(v.wrapping_add(1))).unwrap();
                }
            })
        };
        let mut buf = [0u8; 67];
        for _ in 0..rounds {
            r.read(0, &mut buf).unwrap();
        }
        writer.join().unwrap();
        adder.join().unwrap();
        r.read(0, &mut buf).unwrap();
        assert_eq!(buf[..3], [0, 0, 0]);
        assert_eq!(buf[63..], [0; 4]);
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
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(&bytes[10..15], b"hello");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
