//! Checklist item 2: protection domains (pyverbs `test_pd.py`) and memory regions
//! (`test_mr.py`): lifecycle, `Busy` while in use, keys, access-flag rules (rc-transport.md §7),
//! bounds, file-backed and caller memory, destroyed and foreign handles.

use std::collections::HashSet;

use verbs_api::{
    AccessFlags, Context, ErrorKind, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
    SharedReceiveQueue, SrqAttr,
};

use crate::check::{Outcome, expect_err, expect_kind};
use crate::fixture::{Env, Fixture, TempDir, all_remote};
use crate::{check_eq, ensure};

/// Kinds accepted for a handle used after its `destroy` or passed as an argument after it:
/// the trait documents `Destroyed`, creation calls document `InvalidArgument` for destroyed
/// handles, and both are `EINVAL` in libibverbs.
const DESTROYED: [ErrorKind; 2] = [ErrorKind::Destroyed, ErrorKind::InvalidArgument];

/// A PD can be allocated and deallocated.
pub fn pd_alloc_destroy<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    pd.destroy()?;
    Ok(())
}

/// Deallocating a PD twice fails the second time (`Destroyed`, or `InvalidArgument`).
pub fn pd_double_destroy<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let clone = pd.clone();
    pd.destroy()?;
    expect_err(pd.destroy(), &DESTROYED, "second destroy of a PD")?;
    expect_err(clone.destroy(), &DESTROYED, "destroy through a clone")?;
    Ok(())
}

/// Many PDs coexist with distinct handles and are all deallocated.
pub fn pd_many<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let n = ctx.query_device()?.max_pd.min(100) as usize;
    let pds = (0..n)
        .map(|_| ctx.alloc_pd())
        .collect::<Result<Vec<_>, _>>()?;
    let handles: HashSet<u32> = pds.iter().map(|p| p.handle()).collect();
    check_eq!(handles.len(), n, "distinct PD handles");
    for pd in &pds {
        pd.destroy()?;
    }
    Ok(())
}

/// Deallocating a PD with a live MR is `Busy`; the PD keeps working; once the MRs are gone it
/// deallocates.
pub fn pd_destroy_with_mr_busy<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, 4096, AccessFlags::LOCAL_WRITE)?;
    expect_kind(pd.destroy(), ErrorKind::Busy, "dealloc PD with an MR")?;
    let mr2 = ctx.alloc_mr(&pd, 4096, AccessFlags::LOCAL_WRITE)?;
    mr2.write(0, b"still usable")?;
    mr.destroy()?;
    expect_kind(pd.destroy(), ErrorKind::Busy, "dealloc PD with one MR left")?;
    mr2.destroy()?;
    pd.destroy()?;
    Ok(())
}

/// Deallocating a PD with a live QP is `Busy`; the PD keeps working.
pub fn pd_destroy_with_qp_busy<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let pd = fx.ctx.alloc_pd()?;
    let cq = fx.cq()?;
    let qp = fx
        .ctx
        .create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(fx.cap()))?;
    expect_kind(pd.destroy(), ErrorKind::Busy, "dealloc PD with a QP")?;
    let mr = fx.ctx.alloc_mr(&pd, 64, AccessFlags::LOCAL_WRITE)?;
    mr.destroy()?;
    qp.destroy()?;
    pd.destroy()?;
    Ok(())
}

/// Deallocating a PD with a live SRQ is `Busy`; the PD keeps working.
pub fn pd_destroy_with_srq_busy<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let srq = ctx.create_srq(&pd, &srq_attr())?;
    expect_kind(pd.destroy(), ErrorKind::Busy, "dealloc PD with an SRQ")?;
    let mr = ctx.alloc_mr(&pd, 64, AccessFlags::LOCAL_WRITE)?;
    mr.destroy()?;
    srq.destroy()?;
    pd.destroy()?;
    Ok(())
}

fn srq_attr() -> SrqAttr {
    SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    }
}

/// An MR reports its length, access and address; lkey and rkey are non-zero; it deregisters.
pub fn mr_register_deregister<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, 8192, all_remote())?;
    check_eq!(mr.len(), 8192, "MR length");
    ensure!(!mr.is_empty());
    check_eq!(mr.access(), all_remote(), "MR access");
    ensure!(mr.addr() != 0, "MR address is 0");
    ensure!(mr.lkey() != 0, "lkey is 0 (never a valid key, §7.3)");
    ensure!(mr.rkey() != 0, "rkey is 0 (never a valid key, §7.3)");
    mr.destroy()?;
    pd.destroy()?;
    Ok(())
}

/// Keys of live MRs are all distinct.
pub fn mr_keys_differ<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mrs = (0..16)
        .map(|_| ctx.alloc_mr(&pd, 64, all_remote()))
        .collect::<Result<Vec<_>, _>>()?;
    let lkeys: HashSet<u32> = mrs.iter().map(|m| m.lkey()).collect();
    let rkeys: HashSet<u32> = mrs.iter().map(|m| m.rkey()).collect();
    check_eq!(lkeys.len(), mrs.len(), "distinct lkeys");
    check_eq!(rkeys.len(), mrs.len(), "distinct rkeys");
    Ok(())
}

/// The rkeys of consecutively registered MRs do not follow a constant stride (a `+1` counter
/// or any other), so a peer cannot guess the next key: rxe puts a random byte under the index
/// (rc-transport.md §7.3). Also a re-registration in the same slot gets a new key.
pub fn mr_rkeys_not_sequential<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mrs = (0..8)
        .map(|_| ctx.alloc_mr(&pd, 64, all_remote()))
        .collect::<Result<Vec<_>, _>>()?;
    let keys: Vec<u32> = mrs.iter().map(|m| m.rkey()).collect();
    let deltas: HashSet<u32> = keys.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    ensure!(
        deltas.len() > 1,
        "rkeys {keys:08x?} advance by a constant stride: guessable"
    );
    let old = mrs[0].rkey();
    mrs[0].destroy()?;
    let again = ctx.alloc_mr(&pd, 64, all_remote())?;
    ensure!(
        again.rkey() != old,
        "a new MR reused the rkey {old:#x} of a deregistered one"
    );
    Ok(())
}

/// REMOTE_WRITE without LOCAL_WRITE is `InvalidArgument` (§7.2).
pub fn mr_remote_write_needs_local_write<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    expect_kind(
        ctx.alloc_mr(&pd, 64, AccessFlags::REMOTE_WRITE),
        ErrorKind::InvalidArgument,
        "REMOTE_WRITE alone",
    )?;
    expect_kind(
        ctx.alloc_mr(
            &pd,
            64,
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ),
        ErrorKind::InvalidArgument,
        "REMOTE_WRITE | REMOTE_READ",
    )?;
    let ok = ctx.alloc_mr(
        &pd,
        64,
        AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
    )?;
    ok.destroy()?;
    pd.destroy()?;
    Ok(())
}

/// REMOTE_ATOMIC without LOCAL_WRITE is `InvalidArgument` (§7.2).
pub fn mr_remote_atomic_needs_local_write<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    expect_kind(
        ctx.alloc_mr(&pd, 64, AccessFlags::REMOTE_ATOMIC),
        ErrorKind::InvalidArgument,
        "REMOTE_ATOMIC alone",
    )?;
    let ok = ctx.alloc_mr(
        &pd,
        64,
        AccessFlags::REMOTE_ATOMIC | AccessFlags::LOCAL_WRITE,
    )?;
    ok.destroy()?;
    pd.destroy()?;
    Ok(())
}

/// REMOTE_READ alone is allowed (local read is always allowed, §7.2).
pub fn mr_remote_read_alone_ok<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, 64, AccessFlags::REMOTE_READ)?;
    check_eq!(mr.access(), AccessFlags::REMOTE_READ, "access");
    mr.destroy()?;
    Ok(())
}

/// An MR without any access flag is allowed (local read only).
pub fn mr_no_access_ok<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, 64, AccessFlags::empty())?;
    check_eq!(mr.access(), AccessFlags::empty(), "access");
    mr.destroy()?;
    Ok(())
}

/// An access bit outside the defined and optional ranges (bit 12) is `InvalidArgument`
/// (the kernel's `IB_ACCESS_SUPPORTED` check).
pub fn mr_unknown_access_bits_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let bogus = AccessFlags::from_bits_retain(1 << 12) | AccessFlags::LOCAL_WRITE;
    expect_kind(
        ctx.alloc_mr(&pd, 64, bogus),
        ErrorKind::InvalidArgument,
        "access bit 12",
    )
}

/// A zero-length registration is `InvalidArgument`, for every way of registering.
pub fn mr_zero_length_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    expect_kind(
        ctx.alloc_mr(&pd, 0, AccessFlags::LOCAL_WRITE),
        ErrorKind::InvalidArgument,
        "alloc_mr of 0 bytes",
    )?;
    let dir = TempDir::new("zero-len")?;
    expect_kind(
        ctx.reg_mr_file(&pd, &dir.path().join("mr"), 0, AccessFlags::LOCAL_WRITE),
        ErrorKind::InvalidArgument,
        "reg_mr_file of 0 bytes",
    )?;
    let mut buf = [0u8; 8];
    // SAFETY: `buf` outlives the call and any MR it might create (which is dropped at once,
    // before `buf`); nothing else accesses `buf` meanwhile.
    #[allow(unsafe_code)]
    let raw = unsafe { ctx.reg_mr_raw(&pd, buf.as_mut_ptr(), 0, AccessFlags::LOCAL_WRITE) };
    expect_kind(raw, ErrorKind::InvalidArgument, "reg_mr_raw of 0 bytes")?;
    pd.destroy()?;
    Ok(())
}

/// A length above `max_mr_size` is `InvalidArgument` (when `usize` can express it).
pub fn mr_above_max_size_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let max = ctx.query_device()?.max_mr_size;
    let Some(len) = max.checked_add(1).and_then(|l| usize::try_from(l).ok()) else {
        // max_mr_size is the whole address space (rxe: u64::MAX): nothing is above it.
        let mr = ctx.alloc_mr(&pd, 4096, AccessFlags::LOCAL_WRITE)?;
        mr.destroy()?;
        return Ok(());
    };
    expect_kind(
        ctx.alloc_mr(&pd, len, AccessFlags::LOCAL_WRITE),
        ErrorKind::InvalidArgument,
        "alloc_mr of max_mr_size + 1 bytes",
    )
}

/// Bytes written at an offset read back; a new MR reads as zeroes.
pub fn mr_read_write_round_trip<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, 4096, AccessFlags::LOCAL_WRITE)?;
    let mut zero = [0xAAu8; 64];
    mr.read(0, &mut zero)?;
    check_eq!(zero, [0u8; 64], "a new MR is zeroed");
    let data: Vec<u8> = (0..=255u8).collect();
    mr.write(1000, &data)?;
    let mut back = vec![0u8; 256];
    mr.read(1000, &mut back)?;
    check_eq!(back, data, "round trip at offset 1000");
    mr.write(4095, &[7])?;
    let mut last = [0u8; 1];
    mr.read(4095, &mut last)?;
    check_eq!(last, [7], "last byte");
    mr.write(4096, &[])?;
    Ok(())
}

/// Reads and writes leaving the region are `InvalidArgument` and change nothing.
pub fn mr_read_write_out_of_range<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, 4096, AccessFlags::LOCAL_WRITE)?;
    let inv = ErrorKind::InvalidArgument;
    expect_kind(mr.write(4095, &[1, 2]), inv, "write straddling the end")?;
    expect_kind(mr.write(4096, &[1]), inv, "write past the end")?;
    expect_kind(mr.write(usize::MAX, &[1]), inv, "write at usize::MAX")?;
    let mut two = [0u8; 2];
    expect_kind(mr.read(4095, &mut two), inv, "read straddling the end")?;
    expect_kind(
        mr.read(usize::MAX - 1, &mut two),
        inv,
        "read at usize::MAX - 1",
    )?;
    let mut last = [0xFFu8; 1];
    mr.read(4095, &mut last)?;
    check_eq!(last, [0], "a rejected write changed the last byte");
    Ok(())
}

/// `sge()` covers exactly the region: whole region and empty tail allowed, anything leaving it
/// (or overflowing) `InvalidArgument`.
pub fn mr_sge_bounds<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, 4096, AccessFlags::LOCAL_WRITE)?;
    let whole = mr.sge(0, 4096)?;
    check_eq!(whole.addr, mr.addr(), "SGE address");
    check_eq!(whole.length, 4096, "SGE length");
    check_eq!(whole.lkey, mr.lkey(), "SGE lkey");
    let mid = mr.sge(100, 28)?;
    check_eq!(mid.addr, mr.addr() + 100, "SGE at offset 100");
    mr.sge(4096, 0)?;
    let inv = ErrorKind::InvalidArgument;
    expect_kind(mr.sge(4095, 2), inv, "sge(4095, 2)")?;
    expect_kind(mr.sge(0, 4097), inv, "sge(0, 4097)")?;
    expect_kind(mr.sge(4097, 0), inv, "sge(4097, 0)")?;
    expect_kind(mr.sge(usize::MAX, 2), inv, "sge(usize::MAX, 2)")?;
    Ok(())
}

/// A file-backed MR: bytes written through the MR are in the file; a second MR on the same
/// file sees them and its writes are seen by the first.
pub fn mr_file_backed<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let dir = TempDir::new("mr-file")?;
    let path = dir.path().join("region.bin");
    let mr = ctx.reg_mr_file(&pd, &path, 8192, all_remote())?;
    check_eq!(mr.len(), 8192, "file MR length");
    mr.write(100, b"softverbs")?;
    let bytes = std::fs::read(&path).map_err(|e| crate::check::failure(e.to_string()))?;
    ensure!(
        bytes.len() >= 8192,
        "file has {} bytes, expected 8192",
        bytes.len()
    );
    check_eq!(
        &bytes[100..109],
        b"softverbs",
        "file bytes written through the MR"
    );
    let mr2 = ctx.reg_mr_file(&pd, &path, 8192, AccessFlags::LOCAL_WRITE)?;
    let mut seen = [0u8; 9];
    mr2.read(100, &mut seen)?;
    check_eq!(&seen, b"softverbs", "second MR on the same file");
    mr2.write(200, b"peer")?;
    let mut four = [0u8; 4];
    mr.read(200, &mut four)?;
    check_eq!(&four, b"peer", "first MR sees the second's write");
    ensure!(mr.lkey() != mr2.lkey(), "two registrations share a key");
    mr2.destroy()?;
    mr.destroy()?;
    pd.destroy()?;
    Ok(())
}

/// An MR over caller memory: its address is the buffer's, it reads what the caller wrote
/// before registering, and the caller sees its writes after deregistering.
pub fn mr_raw_caller_buffer<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mut buf: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let ptr = buf.as_mut_ptr();
    // SAFETY: `buf` is 4096 bytes, is neither moved, resized nor accessed by this function
    // while the MR is registered, and outlives the MR: the MR is destroyed below before `buf`
    // is read, and on an early return `mr` (declared after `buf`) is dropped first.
    #[allow(unsafe_code)]
    let mr = unsafe { ctx.reg_mr_raw(&pd, ptr, 4096, AccessFlags::LOCAL_WRITE) }?;
    check_eq!(mr.addr(), ptr as u64, "MR address is the buffer's");
    check_eq!(mr.len(), 4096, "MR length");
    let mut head = [0u8; 8];
    mr.read(250, &mut head)?;
    check_eq!(
        head,
        [250, 0, 1, 2, 3, 4, 5, 6],
        "MR reads the caller's bytes"
    );
    mr.write(10, b"raw!")?;
    mr.destroy()?;
    check_eq!(&buf[10..14], b"raw!", "caller sees the MR's write");
    check_eq!(buf[14], 14, "byte after the write untouched");
    Ok(())
}

/// Every call on a deregistered MR (and on its clones) fails with `Destroyed`.
pub fn mr_use_after_destroy<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    let mr = ctx.alloc_mr(&pd, 64, AccessFlags::LOCAL_WRITE)?;
    let clone = mr.clone();
    mr.destroy()?;
    let d = ErrorKind::Destroyed;
    expect_kind(clone.write(0, &[1]), d, "write after destroy")?;
    let mut b = [0u8; 1];
    expect_kind(clone.read(0, &mut b), d, "read after destroy")?;
    expect_kind(mr.destroy(), d, "second destroy")?;
    pd.destroy()?;
    Ok(())
}

/// Registering in a deallocated PD fails (`Destroyed`, or `InvalidArgument`).
pub fn mr_destroyed_pd_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let pd = ctx.alloc_pd()?;
    pd.destroy()?;
    expect_err(
        ctx.alloc_mr(&pd, 64, AccessFlags::LOCAL_WRITE),
        &DESTROYED,
        "alloc_mr in a destroyed PD",
    )?;
    expect_err(
        ctx.create_srq(&pd, &srq_attr()),
        &DESTROYED,
        "create_srq in a destroyed PD",
    )?;
    Ok(())
}

/// A PD of another context (same device opened twice, and another device) is
/// `InvalidArgument` for MR, SRQ and QP creation.
pub fn foreign_pd_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let same_dev = env.open(0)?;
    let inv = ErrorKind::InvalidArgument;
    let cq = fx.cq()?;
    for (label, other) in [("same device", &same_dev), ("peer device", &fx.peer_ctx)] {
        let pd = other.alloc_pd()?;
        expect_kind(
            fx.ctx.alloc_mr(&pd, 64, AccessFlags::LOCAL_WRITE),
            inv,
            &format!("alloc_mr with a PD of another context ({label})"),
        )?;
        expect_kind(
            fx.ctx.create_srq(&pd, &srq_attr()),
            inv,
            &format!("create_srq with a PD of another context ({label})"),
        )?;
        expect_kind(
            fx.ctx
                .create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(fx.cap())),
            inv,
            &format!("create_qp with a PD of another context ({label})"),
        )?;
        pd.destroy()?;
    }
    let t = fx.qp()?;
    ensure!(t.qp.qp_num() != 0);
    Ok(())
}
