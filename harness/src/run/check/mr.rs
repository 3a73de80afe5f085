//! A node's MR file as the checker reads it: read in bounded pieces at the offsets an
//! invariant asks for, never whole, so that the checker's memory does not grow with the number
//! of QPs (each QP's link block is [`layout::LINK_LEN`](crate::run::layout::LINK_LEN) bytes
//! of mostly sparse file). Tests hold the bytes in memory instead. It does not interpret the
//! bytes (the invariants do, with [`layout`](crate::run::layout)).

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes the zero scan of [`MrFile::nonzero`] reads at a time.
const SCAN_CHUNK: usize = 1 << 20;

/// A chunk of zeros to compare with.
static ZEROS: [u8; SCAN_CHUNK] = [0; SCAN_CHUNK];

/// One node's MR file: the file itself (read with positioned reads), or its bytes in memory.
#[derive(Debug)]
pub(super) enum MrFile {
    /// The file in the run directory and its length when opened.
    File {
        /// The open file.
        file: File,
        /// Its length in bytes.
        len: u64,
    },
    /// The bytes themselves (the checker's tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Memory(Vec<u8>),
}

impl MrFile {
    /// Opens the file at `path` for reading; `None` if it cannot be opened.
    pub(super) fn open(path: &Path) -> Option<MrFile> {
        let file = File::open(path).ok()?;
        let len = file.metadata().ok()?.len();
        Some(MrFile::File { file, len })
    }

    /// Length in bytes.
    pub(super) fn len(&self) -> u64 {
        match self {
            MrFile::File { len, .. } => *len,
            MrFile::Memory(bytes) => bytes.len() as u64,
        }
    }

    /// The `len` bytes at `off`; `None` if they are not all inside the file or cannot be
    /// read.
    pub(super) fn get(&self, off: u64, len: usize) -> Option<Cow<'_, [u8]>> {
        let end = off.checked_add(len as u64)?;
        if end > self.len() {
            return None;
        }
        match self {
            MrFile::Memory(bytes) => {
                let start = usize::try_from(off).ok()?;
                bytes.get(start..start + len).map(Cow::Borrowed)
            }
            MrFile::File { file, .. } => {
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, off).ok()?;
                Some(Cow::Owned(buf))
            }
        }
    }

    /// The native-endian u64 at `off`, if the file holds it.
    pub(super) fn word(&self, off: u64) -> Option<u64> {
        let bytes = self.get(off, 8)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes);
        Some(u64::from_ne_bytes(w))
    }

    /// The non-zero bytes in `[start, end)` (clipped to the file): the offset of the first and
    /// how many there are; `None` if all are zero. Reads [`SCAN_CHUNK`] bytes at a time; a
    /// stretch that cannot be read counts as all non-zero.
    pub(super) fn nonzero(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        let end = end.min(self.len());
        let mut found: Option<(u64, u64)> = None;
        let mut at = start;
        while at < end {
            let n = usize::try_from(end - at).map_or(SCAN_CHUNK, |n| n.min(SCAN_CHUNK));
            let (first, count) = match self.get(at, n) {
                // All zero (the common case, a hole): one memcmp, fast in debug builds too.
                Some(chunk) if *chunk == ZEROS[..n] => (None, 0),
                Some(chunk) => (
                    chunk.iter().position(|b| *b != 0),
                    chunk.iter().filter(|b| **b != 0).count() as u64,
                ),
                None => (Some(0), n as u64),
            };
            if let Some(first) = first {
                let (off, total) = found.unwrap_or((at + first as u64, 0));
                found = Some((off, total + count));
            }
            at += n as u64;
        }
        found
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn file_and_memory_read_alike() {
        let mut bytes = vec![0u8; 3 * SCAN_CHUNK + 100];
        bytes[5] = 1;
        bytes[SCAN_CHUNK + 7] = 2;
        bytes[3 * SCAN_CHUNK + 99] = 3;
        let path = std::env::temp_dir().join(format!("softverbs-mrfile-{}.mr", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let file = MrFile::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let memory = MrFile::Memory(bytes);
        for mr in [&file, &memory] {
            assert_eq!(mr.len(), 3 * SCAN_CHUNK as u64 + 100);
            assert_eq!(mr.get(4, 3).unwrap().as_ref(), &[0, 1, 0]);
            assert_eq!(mr.get(mr.len() - 1, 1).unwrap().as_ref(), &[3]);
            assert!(mr.get(mr.len() - 1, 2).is_none());
            assert!(mr.get(u64::MAX, 2).is_none());
            assert_eq!(
                mr.word(0),
                Some(u64::from_ne_bytes([0, 0, 0, 0, 0, 1, 0, 0]))
            );
            assert_eq!(mr.nonzero(0, mr.len()), Some((5, 3)));
            assert_eq!(mr.nonzero(6, u64::MAX), Some((SCAN_CHUNK as u64 + 7, 2)));
            assert_eq!(mr.nonzero(SCAN_CHUNK as u64 + 8, mr.len() - 1), None);
            assert_eq!(mr.nonzero(10, 5), None);
        }
    }
}
