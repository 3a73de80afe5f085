//! The handle layer over a minimal port: one device, no network, no time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as WallClock};

use emu_proto::{Hca, HcaConfig, Instant, Memory};
use verbs_api::{
    AccessFlags, CompletionQueue, Context as _, ErrorKind, Gid, MemoryRegion, ProtectionDomain,
    QpCap, QpInitAttr,
};

use crate::{ChannelShared, Context, DeviceState, Idle, MrAddresses, Port, Waiting};

/// A device behind a mutex, driven by nothing: every call just runs on the state.
#[derive(Clone, Debug)]
struct Bare(Arc<Mutex<DeviceState>>);

impl Bare {
    fn open(addresses: MrAddresses) -> Context<Bare> {
        let gid = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)));
        let hca = Hca::new(HcaConfig::new("bare0".to_string(), gid, 1));
        let port = Bare(Arc::new(Mutex::new(DeviceState::new(hca, addresses))));
        Context::open(port).unwrap()
    }
}

impl Port for Bare {
    fn device_name(&self) -> String {
        "bare0".into()
    }

    fn command<R>(&self, f: impl FnOnce(&mut DeviceState, Instant) -> R) -> verbs_api::Result<R> {
        let mut st = self.0.lock().unwrap();
        let r = f(&mut st, Instant::ZERO);
        st.deliver();
        Ok(r)
    }

    fn query<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> verbs_api::Result<R> {
        self.command(|st, _| f(st))
    }

    fn peek<R>(&self, f: impl FnOnce(&mut DeviceState) -> R) -> verbs_api::Result<R> {
        Ok(f(&mut self.0.lock().unwrap()))
    }

    fn wait_take<R>(
        &self,
        _what: Waiting,
        take: impl FnMut(&mut DeviceState) -> verbs_api::Result<Option<R>>,
    ) -> verbs_api::Result<Option<R>> {
        self.query(take)?
    }

    fn wait_channel(
        &self,
        channel: &ChannelShared,
        timeout: Option<Duration>,
    ) -> verbs_api::Result<Option<u32>> {
        Ok(channel.wait(timeout))
    }

    fn between_polls(&self, _start: WallClock) -> verbs_api::Result<Idle> {
        Ok(Idle::Idle)
    }
}

const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

#[test]
fn synthetic_addresses_are_page_aligned_with_a_guard_page() {
    let ctx = Bare::open(MrAddresses::Synthetic);
    let pd = ctx.alloc_pd().unwrap();
    let a = ctx.alloc_mr(&pd, 5000, RW).unwrap();
    let b = ctx.alloc_mr(&pd, 10, RW).unwrap();
    assert_eq!(a.addr(), 0x1000_0000);
    // 5000 bytes take two pages, then one guard page.
    assert_eq!(b.addr(), 0x1000_0000 + 3 * 4096);
}

#[test]
fn host_addresses_are_the_memory_itself() {
    let ctx = Bare::open(MrAddresses::Host);
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = [0u8; 16];
    // SAFETY: `buf` outlives the MR, which is destroyed before the end of the test.
    #[allow(unsafe_code)]
    let mr = unsafe { ctx.reg_mr_raw(&pd, buf.as_mut_ptr(), buf.len(), RW) }.unwrap();
    let owned = ctx.alloc_mr(&pd, 64, RW).unwrap();
    assert_eq!(mr.addr(), buf.as_ptr() as u64);
    assert_ne!(owned.addr(), 0x1000_0000);
    mr.destroy().unwrap();
}

#[test]
fn dropping_the_last_handle_deregisters_the_mr() {
    let ctx = Bare::open(MrAddresses::Host);
    let pd = ctx.alloc_pd().unwrap();
    let mr = ctx.alloc_mr(&pd, 64, RW).unwrap();
    let lkey = mr.lkey();
    let routed = |ctx: &Context<Bare>| {
        ctx.peek(|st| st.mem.read(lkey, 0, &mut [0u8; 8]).is_ok())
            .unwrap()
    };
    let copy = mr.clone();
    drop(mr);
    assert!(routed(&ctx), "a clone keeps the MR");
    drop(copy);
    assert!(!routed(&ctx));
}

#[test]
fn destroyed_parents_and_foreign_handles_are_refused() {
    let ctx = Bare::open(MrAddresses::Host);
    let other = Bare::open(MrAddresses::Host);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let foreign_cq = other.create_cq(8, None).unwrap();
    let attr = QpInitAttr::rc(QpCap::default());
    let err = ctx
        .create_qp(&pd, &foreign_cq, &cq, None, &attr)
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    pd.destroy().unwrap();
    assert_eq!(pd.destroy().unwrap_err().kind, ErrorKind::Destroyed);
    let err = ctx.create_qp(&pd, &cq, &cq, None, &attr).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Destroyed);
}

#[test]
fn next_completion_on_an_idle_device_fails_at_once() {
    let ctx = Bare::open(MrAddresses::Host);
    let cq = ctx.create_cq(8, None).unwrap();
    assert_eq!(cq.poll(&mut []).unwrap(), 0);
    let err = cq.next_completion().unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidState);
}

#[test]
fn an_ah_keeps_its_pd_until_destroyed_or_dropped() {
    use verbs_api::{AddressHandle, AhAttr};
    let ctx = Bare::open(MrAddresses::Host);
    let other = Bare::open(MrAddresses::Host);
    let pd = ctx.alloc_pd().unwrap();
    let attr = AhAttr {
        dgid: Gid::from_ip("127.0.0.9".parse().unwrap()),
        ..AhAttr::default()
    };
    let ah = ctx.create_ah(&pd, &attr).unwrap();
    assert_eq!(pd.destroy().unwrap_err().kind, ErrorKind::Busy);
    let copy = ah.clone();
    drop(ah);
    assert_eq!(
        pd.destroy().unwrap_err().kind,
        ErrorKind::Busy,
        "a clone keeps it"
    );
    drop(copy);
    pd.destroy().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ah = ctx.create_ah(&pd, &attr).unwrap();
    ah.destroy().unwrap();
    assert_eq!(ah.destroy().unwrap_err().kind, ErrorKind::Destroyed);
    let foreign = other.alloc_pd().unwrap();
    let err = ctx.create_ah(&foreign, &attr).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
}

#[test]
fn an_mr_the_machine_cannot_hold_is_no_memory_not_an_abort() {
    let ctx = Bare::open(MrAddresses::Synthetic);
    let pd = ctx.alloc_pd().unwrap();
    // 1 TiB, the device's max_mr_size: more than this machine's memory and swap, so the
    // kernel refuses the mapping (with overcommit off or heuristic). Under `vm.overcommit_memory
    // = 1` it maps lazily instead; either way the process does not abort.
    let len = usize::try_from(ctx.query_device().unwrap().max_mr_size).unwrap();
    match ctx.alloc_mr(&pd, len, RW) {
        Err(e) => assert_eq!(e.kind, ErrorKind::NoMemory, "{e}"),
        Ok(mr) => {
            // Only the touched page is committed.
            mr.write(len - 8, &[1; 8]).unwrap();
            mr.destroy().unwrap();
        }
    }
    // A large MR that fits is mapped lazily: nothing is committed until touched.
    let mr = ctx.alloc_mr(&pd, 1 << 30, RW).unwrap();
    let mut b = [9u8; 4];
    mr.read((1 << 30) - 4, &mut b).unwrap();
    assert_eq!(b, [0; 4]);
}
