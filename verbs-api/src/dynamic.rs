//! Run-time backend selection: type-erased verbs handles and a registry of providers.
//!
//! [`AnyDevice`], [`AnyContext`] and the handles a context creates ([`AnyPd`], [`AnyMr`],
//! [`AnyCq`], [`AnyChannel`], [`AnySrq`], [`AnyQp`], [`AnyAh`], [`AnyMw`]) implement the traits of
//! [`crate::traits`] by forwarding every call to the backend they wrap, so code written against
//! `C: Context` runs unchanged on a backend chosen from configuration. The price is one
//! virtual call per verbs call (data path included) and one `Arc` per handle; code that wants
//! static dispatch back uses `downcast_ref`.
//!
//! Handles created by one backend and passed to a context of another backend (e.g. an emulator
//! PD to a hardware context) fail with [`ErrorKind::InvalidArgument`] ("… belongs to another
//! provider"), never a panic. Handles of another *context* of the same backend are the
//! backend's to reject, as with static dispatch.
//!
//! Type erasure needs every method three times: in an object-safe mirror of the verbs trait, in
//! the mirror's blanket impl for every backend type, and in the erased type's impl of the verbs
//! trait. No restructuring removes a copy (the verbs traits are `Clone`, hence not object safe,
//! and the erased types must implement them), so each method is written once, as its signature
//! in a macro invocation that generates all three: `erased_handle!` for
//! the leaf handles, whose calls pass through unchanged, and `erased_factory!` for
//! [`AnyContext`] and [`AnyDevice`], which take and return handles. Their conversions are chosen
//! by type rather than written per method: an erased handle argument becomes the backend's own
//! handle (or fails as above), a returned backend handle is wrapped, and every other value
//! passes unchanged. So each invocation reads as the trait's own list of signatures, the
//! compiler checks every line against the trait, and a new trait method is one line here.
//!
//! [`Registry`] maps provider names to device factories. This crate knows no backend: the
//! `softverbs` facade pre-registers the built-in ones, and applications may add their own.
//! [`Registry::open_from_env`] picks the provider from [`PROVIDER_ENV`] and the device from
//! [`DEVICE_ENV`].
//!
//! ```
//! use verbs_api::dynamic::Registry;
//! use verbs_api::{AccessFlags, Context, MemoryRegion, ProtectionDomain, Result};
//!
//! /// Generic code: runs on any backend, statically or through `AnyContext`.
//! fn fill<C: Context>(ctx: &C) -> Result<()> {
//!     let pd = ctx.alloc_pd()?;
//!     let mr = ctx.alloc_mr(&pd, 4096, AccessFlags::LOCAL_WRITE)?;
//!     mr.write(0, b"hello")?;
//!     mr.destroy()?;
//!     pd.destroy()
//! }
//!
//! let mut registry = Registry::new();
//! // Backends register themselves, e.g. `registry.register_provider(emu::Provider::default())`;
//! // this one offers no device.
//! registry.register("none", || Ok(Vec::new()));
//! match registry.open_from_env("none") {
//!     Ok(ctx) => fill(&ctx)?,
//!     Err(e) => eprintln!("no RDMA device: {e}"),
//! }
//! # Ok::<(), verbs_api::Error>(())
//! ```

use std::any::{Any, type_name};
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::attr::{AhAttr, DeviceAttr, PortAttr, QpAttr, QpInitAttr, SrqAttr};
use crate::error::{Error, ErrorKind, PostError, Result};
use crate::event::AsyncEvent;
use crate::traits::{
    AddressHandle, CompletionChannel, CompletionQueue, Context, Device, MemoryRegion, MemoryWindow,
    ProtectionDomain, Provider, QueuePair, SharedReceiveQueue,
};
use crate::types::{AccessFlags, Endpoint, Gid, MwType, QpAttrMask, QpState, QpType};
use crate::wc::WorkCompletion;
use crate::wr::{MwBind, RecvWr, SendWr, Sge};

/// The environment variable naming the provider [`Registry::open_from_env`] opens, e.g.
/// `SOFTVERBS_PROVIDER=emu`. Unset or blank means the caller's default provider.
pub const PROVIDER_ENV: &str = "SOFTVERBS_PROVIDER";

/// The environment variable naming the device [`Registry::open_from_env`] opens, e.g.
/// `SOFTVERBS_DEVICE=rxe0`. Unset or blank means the provider's first device.
pub const DEVICE_ENV: &str = "SOFTVERBS_DEVICE";

/// What every erased object offers besides its trait's methods: the value behind the `dyn`, for
/// `downcast_ref`, and its type's name, for `Debug` and error messages.
///
/// Implemented for every type, so call it on the `dyn` (`Erased::as_any(&*arc)`), never on the
/// `Arc` holding it, which would answer for the `Arc` itself.
trait Erased: Send + Sync + 'static {
    fn as_any(&self) -> &dyn Any;
    fn type_name(&self) -> &'static str;
}

impl<T: Send + Sync + 'static> Erased for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn type_name(&self) -> &'static str {
        type_name::<T>()
    }
}

/// An argument of an erased call made into the backend's argument `T`: an erased handle becomes
/// the backend's concrete handle, or `InvalidArgument` if another backend made it; a [`Plain`]
/// value stays as it is.
trait ToBackend<T> {
    fn to_backend(self) -> Result<T>;
}

/// A backend's result `T` made into the erased call's: the backend's handles are wrapped in
/// their erased handle type; a [`Plain`] value stays as it is.
trait FromBackend<T> {
    fn from_backend(backend: T) -> Self;
}

/// A type that is the same for every backend, so it crosses the erased boundary unchanged. A new
/// argument or result type of a factory method is listed below (the compiler asks for it).
trait Plain {}

impl<T: Plain> ToBackend<T> for T {
    fn to_backend(self) -> Result<T> {
        Ok(self)
    }
}

impl<T: Plain> FromBackend<T> for T {
    fn from_backend(backend: T) -> T {
        backend
    }
}

impl<T: Plain> Plain for Option<T> {}
impl<T: Plain> Plain for Result<T> {}

/// Marks each of the types as [`Plain`].
macro_rules! plain {
    ($($t:ty),* $(,)?) => {
        $(impl Plain for $t {})*
    };
}

plain!(u8, u16, u32, u64, usize, String, *mut u8);
plain!(AccessFlags, Gid, AsyncEvent, DeviceAttr, PortAttr, MwType);
plain!(&Path, &SrqAttr, &QpInitAttr, &AhAttr, &MwBind);

/// The `$name` handle around `Arc<dyn $erased>`: its `Debug` naming the wrapped type, and
/// `downcast_ref` back to that type beside the inherent `$item`s given (its constructor).
macro_rules! erased_struct {
    (
        $(#[$attr:meta])*
        $name:ident($erased:ident: $bound:ident), $noun:literal { $($item:item)* }
    ) => {
        $(#[$attr])*
        #[derive(Clone)]
        pub struct $name(Arc<dyn $erased>);

        impl $name {
            $($item)*

            fn type_name(&self) -> &'static str {
                Erased::type_name(&*self.0)
            }

            #[doc = concat!("The backend's concrete ", $noun, ", if this one wraps a `T`, for code")]
            /// that wants static dispatch back.
            pub fn downcast_ref<T: $bound>(&self) -> Option<&T> {
                Erased::as_any(&*self.0).downcast_ref()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.type_name())
            }
        }
    };
}

/// A leaf handle (one that creates nothing): an object-safe `$erased` trait mirroring the
/// methods of `$tr…` with a blanket impl for every `$bound`, the `$name` handle (see
/// `erased_struct!`), and `impl $tr for $name` forwarding each method (default methods
/// included, so backend overrides are kept). Arguments and results pass unchanged; as an
/// argument of a factory's call, the handle converts to the backend's (`$noun` names it in the
/// error for another backend's handle) and a backend's handle result converts to it.
macro_rules! erased_handle {
    (
        $(#[$attr:meta])*
        $name:ident($erased:ident: $bound:ident, $noun:literal) {
            $(impl $tr:ident {
                $(fn $m:ident(&self $(, $a:ident: $t:ty)*) $(-> $r:ty)?;)*
            })+
        }
    ) => {
        trait $erased: Erased {
            $($(fn $m(&self $(, $a: $t)*) $(-> $r)?;)*)+
        }

        impl<T: $bound> $erased for T {
            $($(fn $m(&self $(, $a: $t)*) $(-> $r)? {
                <T as $tr>::$m(self $(, $a)*)
            })*)+
        }

        erased_struct!($(#[$attr])* $name($erased: $bound), "handle" {
            fn new<T: $bound>(inner: T) -> $name {
                $name(Arc::new(inner))
            }
        });

        $(impl $tr for $name {
            $(fn $m(&self $(, $a: $t)*) $(-> $r)? {
                $erased::$m(&*self.0 $(, $a)*)
            })*
        })+

        impl<'a, T: $bound> ToBackend<&'a T> for &'a $name {
            fn to_backend(self) -> Result<&'a T> {
                Erased::as_any(&*self.0).downcast_ref().ok_or_else(|| {
                    Error::invalid(format!(
                        "{} belongs to another provider (a {}, this context takes {})",
                        $noun,
                        self.type_name(),
                        type_name::<T>()
                    ))
                })
            }
        }

        impl<'a, T: $bound> ToBackend<Option<&'a T>> for Option<&'a $name> {
            fn to_backend(self) -> Result<Option<&'a T>> {
                self.map(ToBackend::to_backend).transpose()
            }
        }

        impl<T: $bound> FromBackend<Result<T>> for Result<$name> {
            fn from_backend(backend: Result<T>) -> Result<$name> {
                backend.map($name::new)
            }
        }
    };
}

erased_handle! {
    /// A protection domain of any backend, created by [`AnyContext::alloc_pd`].
    AnyPd(ErasedPd: ProtectionDomain, "protection domain") {
        impl ProtectionDomain {
            fn handle(&self) -> u32;
            fn destroy(&self) -> Result<()>;
        }
    }
}

erased_handle! {
    /// A memory region of any backend, created by an [`AnyContext`].
    AnyMr(ErasedMr: MemoryRegion, "memory region") {
        impl MemoryRegion {
            fn lkey(&self) -> u32;
            fn rkey(&self) -> u32;
            fn addr(&self) -> u64;
            fn len(&self) -> usize;
            fn is_empty(&self) -> bool;
            fn access(&self) -> AccessFlags;
            fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()>;
            fn write(&self, offset: usize, data: &[u8]) -> Result<()>;
            fn sge(&self, offset: usize, len: usize) -> Result<Sge>;
            fn destroy(&self) -> Result<()>;
        }
    }
}

erased_handle! {
    /// A completion queue of any backend, created by [`AnyContext::create_cq`].
    AnyCq(ErasedCq: CompletionQueue, "completion queue") {
        impl CompletionQueue {
            fn handle(&self) -> u32;
            fn capacity(&self) -> u32;
            fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize>;
            fn req_notify(&self, solicited_only: bool) -> Result<()>;
            fn ack_events(&self, n: u32);
            fn resize(&self, cqe: u32) -> Result<()>;
            fn destroy(&self) -> Result<()>;
        }
    }
}

erased_handle! {
    /// A completion channel of any backend, created by [`AnyContext::create_comp_channel`].
    /// Its file descriptor is the backend's, so it can be registered with epoll, mio or tokio.
    AnyChannel(ErasedChannel: CompletionChannel, "completion channel") {
        impl CompletionChannel {
            fn get_cq_event(&self) -> Result<Option<u32>>;
            fn wait_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>>;
            fn destroy(&self) -> Result<()>;
        }
        impl AsFd {
            fn as_fd(&self) -> BorrowedFd<'_>;
        }
        impl AsRawFd {
            fn as_raw_fd(&self) -> RawFd;
        }
    }
}

erased_handle! {
    /// A shared receive queue of any backend, created by [`AnyContext::create_srq`].
    AnySrq(ErasedSrq: SharedReceiveQueue, "shared receive queue") {
        impl SharedReceiveQueue {
            fn handle(&self) -> u32;
            fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;
            fn query(&self) -> Result<SrqAttr>;
            fn arm_limit(&self, srq_limit: u32) -> Result<()>;
            fn destroy(&self) -> Result<()>;
        }
    }
}

erased_handle! {
    /// A queue pair of any backend, created by [`AnyContext::create_qp`].
    AnyQp(ErasedQp: QueuePair, "queue pair") {
        impl QueuePair {
            fn qp_num(&self) -> u32;
            fn qp_type(&self) -> QpType;
            fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()>;
            fn query(&self) -> Result<QpAttr>;
            fn state(&self) -> Result<QpState>;
            fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;
            fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;
            fn endpoint(&self, psn: u32) -> Result<Endpoint>;
            fn destroy(&self) -> Result<()>;
        }
    }
}

erased_handle! {
    /// An address handle of any backend, created by [`AnyContext::create_ah`].
    AnyAh(ErasedAh: AddressHandle, "address handle") {
        impl AddressHandle {
            fn handle(&self) -> u32;
            fn destroy(&self) -> Result<()>;
        }
    }
}

erased_handle! {
    /// A memory window of any backend, created by [`AnyContext::alloc_mw`].
    AnyMw(ErasedMw: MemoryWindow, "memory window") {
        impl MemoryWindow {
            fn handle(&self) -> u32;
            fn mw_type(&self) -> MwType;
            fn rkey(&self) -> u32;
            fn destroy(&self) -> Result<()>;
        }
    }
}

/// A factory of handles (`Context`, `Device`): as `erased_handle!`, but each call converts its
/// arguments with [`ToBackend`] before reaching the backend (so a handle of another backend
/// fails there, before the backend is called) and its result with [`FromBackend`]; the public
/// `new` does not wrap a `$name` twice. A method with arguments returns a `Result` (a converted
/// argument may fail). `unsafe` methods come last; their contract is the trait's, forwarded
/// unchanged.
macro_rules! erased_factory {
    (
        $(#[$attr:meta])*
        $name:ident($erased:ident: $tr:ident, $noun:literal) {
            $(type $assoc:ident = $aty:ty;)*
            $(fn $m:ident(&self $(, $a:ident: $t:ty)* $(,)?) -> $r:ty;)*
            $(unsafe fn $um:ident(&self $(, $ua:ident: $ut:ty)* $(,)?) -> $ur:ty;)*
        }
    ) => {
        trait $erased: Erased {
            $(fn $m(&self $(, $a: $t)*) -> $r;)*
            $(
                /// Same contract as the trait method of the same name.
                #[allow(unsafe_code)] // declaration only
                unsafe fn $um(&self $(, $ua: $ut)*) -> $ur;
            )*
        }

        impl<T: $tr> $erased for T {
            $(fn $m(&self $(, $a: $t)*) -> $r {
                $(let $a = ToBackend::to_backend($a)?;)*
                FromBackend::from_backend(<T as $tr>::$m(self $(, $a)*))
            })*
            $(
                #[allow(unsafe_code)] // forwards the trait method
                unsafe fn $um(&self $(, $ua: $ut)*) -> $ur {
                    $(let $ua = ToBackend::to_backend($ua)?;)*
                    // SAFETY: our caller upholds the trait method's contract; the call passes
                    // the same values on (erased handles made concrete).
                    FromBackend::from_backend(unsafe { <T as $tr>::$um(self $(, $ua)*) })
                }
            )*
        }

        erased_struct!($(#[$attr])* $name($erased: $tr), $noun {
            #[doc = concat!("Erases `inner`. Erasing an `", stringify!($name), "` returns it as")]
            /// is rather than wrapping it twice.
            pub fn new<T: $tr>(inner: T) -> $name {
                match (&inner as &dyn Any).downcast_ref::<$name>() {
                    Some(erased) => erased.clone(),
                    None => $name(Arc::new(inner)),
                }
            }
        });

        impl<T: $tr> FromBackend<Result<T>> for Result<$name> {
            fn from_backend(backend: Result<T>) -> Result<$name> {
                backend.map($name::new)
            }
        }

        impl $tr for $name {
            $(type $assoc = $aty;)*

            $(fn $m(&self $(, $a: $t)*) -> $r {
                $erased::$m(&*self.0 $(, $a)*)
            })*
            $(
                #[allow(unsafe_code)] // forwards the trait method
                unsafe fn $um(&self $(, $ua: $ut)*) -> $ur {
                    // SAFETY: our caller upholds the trait method's contract; the call passes
                    // the same values on.
                    unsafe { $erased::$um(&*self.0 $(, $ua)*) }
                }
            )*
        }
    };
}

erased_factory! {
    /// An open device of any backend: a [`Context`] whose handles are [`AnyPd`], [`AnyMr`],
    /// [`AnyCq`], [`AnyChannel`], [`AnySrq`], [`AnyQp`], [`AnyAh`] and [`AnyMw`].
    ///
    /// Every call forwards to the wrapped context with the same contract. A handle argument made
    /// by a different backend fails with `InvalidArgument` before the backend is called.
    AnyContext(ErasedContext: Context, "context") {
        type Pd = AnyPd;
        type Mr = AnyMr;
        type Cq = AnyCq;
        type Channel = AnyChannel;
        type Srq = AnySrq;
        type Qp = AnyQp;
        type Ah = AnyAh;
        type Mw = AnyMw;
        fn device_name(&self) -> String;
        fn query_device(&self) -> Result<DeviceAttr>;
        fn query_port(&self, port_num: u8) -> Result<PortAttr>;
        fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid>;
        fn query_pkey(&self, port_num: u8, index: u16) -> Result<u16>;
        fn alloc_pd(&self) -> Result<AnyPd>;
        fn alloc_mr(&self, pd: &AnyPd, len: usize, access: AccessFlags) -> Result<AnyMr>;
        fn reg_mr_file(&self, pd: &AnyPd, path: &Path, len: usize, access: AccessFlags)
            -> Result<AnyMr>;
        fn create_comp_channel(&self) -> Result<AnyChannel>;
        fn create_cq(&self, cqe: u32, channel: Option<&AnyChannel>) -> Result<AnyCq>;
        fn create_srq(&self, pd: &AnyPd, attr: &SrqAttr) -> Result<AnySrq>;
        fn create_qp(
            &self,
            pd: &AnyPd,
            send_cq: &AnyCq,
            recv_cq: &AnyCq,
            srq: Option<&AnySrq>,
            attr: &QpInitAttr,
        ) -> Result<AnyQp>;
        fn create_ah(&self, pd: &AnyPd, attr: &AhAttr) -> Result<AnyAh>;
        fn poll_async_event(&self) -> Option<AsyncEvent>;
        fn alloc_mw(&self, pd: &AnyPd, mw_type: MwType) -> Result<AnyMw>;
        fn bind_mw(&self, qp: &AnyQp, mw: &AnyMw, bind: &MwBind) -> Result<u32>;
        unsafe fn reg_mr_raw(&self, pd: &AnyPd, addr: *mut u8, len: usize, access: AccessFlags)
            -> Result<AnyMr>;
    }
}

erased_factory! {
    /// A device of any backend; [`Device::open`] gives an [`AnyContext`].
    AnyDevice(ErasedDevice: Device, "device") {
        type Context = AnyContext;
        fn name(&self) -> String;
        fn node_guid(&self) -> u64;
        fn open(&self) -> Result<AnyContext>;
    }
}

/// A device factory: lists a provider's devices each time it is called.
type Factory = Box<dyn Fn() -> Result<Vec<AnyDevice>> + Send + Sync>;

/// Named device factories, for choosing a backend by configuration without recompiling.
///
/// Providers are kept in registration order. The registry knows no backend by itself; the
/// `softverbs` facade returns one with the built-in providers registered.
#[derive(Default)]
pub struct Registry {
    providers: Vec<(&'static str, Factory)>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("providers", &self.names())
            .finish()
    }
}

/// `a, b, c`, or `none` for an empty list.
fn list(names: &[impl AsRef<str>]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers `factory` under `name`, replacing a provider registered earlier under the same
    /// name (keeping its position). The factory is called on every [`devices`](Self::devices),
    /// [`open`](Self::open) and [`open_from_env`](Self::open_from_env), so it sees devices
    /// that appear later; its errors are returned unchanged.
    pub fn register(
        &mut self,
        name: &'static str,
        factory: impl Fn() -> Result<Vec<AnyDevice>> + Send + Sync + 'static,
    ) {
        let factory: Factory = Box::new(factory);
        match self.providers.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = factory,
            None => self.providers.push((name, factory)),
        }
    }

    /// Registers `provider` under [`Provider::name`], erasing its devices; as
    /// [`register`](Self::register).
    pub fn register_provider<P: Provider + 'static>(&mut self, provider: P) {
        let name = provider.name();
        self.register(name, move || {
            Ok(provider
                .devices()?
                .into_iter()
                .map(AnyDevice::new)
                .collect())
        });
    }

    /// The registered provider names, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.providers.iter().map(|(name, _)| *name).collect()
    }

    /// The devices of provider `name` (possibly none). An unknown name fails with `NotFound`
    /// listing the registered providers; a factory error is returned unchanged.
    pub fn devices(&self, name: &str) -> Result<Vec<AnyDevice>> {
        match self.providers.iter().find(|(n, _)| *n == name) {
            Some((_, factory)) => factory(),
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "unknown provider {name:?} (registered providers: {})",
                    list(&self.names())
                ),
            )),
        }
    }

    /// Opens the device named `device` of provider `name`, or its first device with `None`.
    ///
    /// Fails with `NotFound` if the provider is unknown (listing the registered providers), has
    /// no device, or has no device of that name (listing its devices); otherwise with the error
    /// of the factory or of [`Device::open`].
    pub fn open(&self, name: &str, device: Option<&str>) -> Result<AnyContext> {
        let devices = self.devices(name)?;
        let found = match device {
            None => devices.first(),
            Some(wanted) => devices.iter().find(|d| Device::name(*d) == wanted),
        };
        match found {
            Some(dev) => Device::open(dev),
            None => {
                let names: Vec<String> = devices.iter().map(Device::name).collect();
                let which = device.map_or_else(String::new, |d| format!(" {d:?}"));
                Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "provider {name:?} has no device{which} (its devices: {})",
                        list(&names)
                    ),
                ))
            }
        }
    }

    /// As [`open`](Self::open), with `None` for the provider meaning the first registered one
    /// (`NotFound` if none is). [`open_from_env`](Self::open_from_env) calls it with the
    /// variables' values, its default standing in for an unset provider.
    pub fn open_with(&self, provider: Option<&str>, device: Option<&str>) -> Result<AnyContext> {
        match provider.or_else(|| self.providers.first().map(|(name, _)| *name)) {
            Some(name) => self.open(name, device),
            None => Err(Error::new(ErrorKind::NotFound, "no provider is registered")),
        }
    }

    /// Opens the device named by [`DEVICE_ENV`] (first device if unset) of the provider named
    /// by [`PROVIDER_ENV`] (`default_provider` if unset). Blank values count as unset and
    /// surrounding whitespace is ignored; a value that is not UTF-8 fails with
    /// `InvalidArgument`. Otherwise as [`open`](Self::open): an unknown provider fails with
    /// `NotFound` naming the registered ones.
    pub fn open_from_env(&self, default_provider: &str) -> Result<AnyContext> {
        let provider = env_value(PROVIDER_ENV)?;
        let device = env_value(DEVICE_ENV)?;
        self.open_with(
            Some(provider.as_deref().unwrap_or(default_provider)),
            device.as_deref(),
        )
    }
}

/// The trimmed value of `var`, `None` if unset or blank.
fn env_value(var: &str) -> Result<Option<String>> {
    match std::env::var(var) {
        Ok(value) if value.trim().is_empty() => Ok(None),
        Ok(value) => Ok(Some(value.trim().to_owned())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => Err(Error::invalid(format!(
            "{var}={value:?} is not valid UTF-8"
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::fs::File;
    use std::process::Command;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::{
        AnyContext, AnyDevice, Arc, AsFd, AsRawFd, BorrowedFd, DEVICE_ENV, Duration, PROVIDER_ENV,
        Path, RawFd, Registry, env_value, fmt,
    };
    use crate::attr::{AhAttr, DeviceAttr, PortAttr, QpAttr, QpCap, QpInitAttr, SrqAttr};
    use crate::error::{Error, ErrorKind, PostError, Result};
    use crate::event::AsyncEvent;
    use crate::traits::{
        AddressHandle, CompletionChannel, CompletionQueue, Context, Device, MemoryRegion,
        MemoryWindow, ProtectionDomain, Provider, QueuePair, SharedReceiveQueue,
    };
    use crate::types::{
        AccessFlags, Endpoint, Gid, MwType, QpAttrMask, QpState, QpType, ROCE_V2_UDP_PORT,
    };
    use crate::wc::WorkCompletion;
    use crate::wr::{MwBind, RecvWr, SendOp, SendWr};

    type Log = Arc<Mutex<Vec<String>>>;

    /// A fake backend whose objects record every call in the context's log. `B` makes
    /// `Fake<1>` and `Fake<2>` two backends with distinct handle types.
    #[derive(Clone)]
    struct Fake<const B: u8> {
        device: String,
        log: Log,
        next: Arc<AtomicU32>,
        fd: Arc<File>,
    }

    impl<const B: u8> Fake<B> {
        fn new(device: &str) -> Self {
            Fake {
                device: device.to_owned(),
                log: Log::default(),
                next: Arc::default(),
                fd: Arc::new(File::open("/dev/null").unwrap()),
            }
        }

        fn calls(&self) -> Vec<String> {
            self.log.lock().unwrap().clone()
        }

        fn obj(&self, call: String, kind: &'static str, len: usize) -> Result<Obj<B>> {
            let handle = self.next.fetch_add(1, Ordering::Relaxed) + 1;
            self.log
                .lock()
                .unwrap()
                .push(format!("{call} -> {kind}{handle}"));
            Ok(Obj {
                kind,
                handle,
                log: self.log.clone(),
                mem: Arc::new(Mutex::new(vec![0; len])),
                fd: self.fd.clone(),
            })
        }
    }

    /// Every object of the fake (PD, MR, CQ, channel, SRQ, QP).
    #[derive(Clone)]
    struct Obj<const B: u8> {
        kind: &'static str,
        handle: u32,
        log: Log,
        mem: Arc<Mutex<Vec<u8>>>,
        fd: Arc<File>,
    }

    impl<const B: u8> Obj<B> {
        fn ok(&self, call: &str) -> Result<()> {
            let entry = format!("{}{}.{call}", self.kind, self.handle);
            self.log.lock().unwrap().push(entry);
            Ok(())
        }

        fn range(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
            let end = offset + len;
            if end > self.mem.lock().unwrap().len() {
                return Err(Error::invalid(format!("{offset}+{len} outside fake MR")));
            }
            Ok(offset..end)
        }
    }

    impl<const B: u8> Context for Fake<B> {
        type Pd = Obj<B>;
        type Mr = Obj<B>;
        type Cq = Obj<B>;
        type Channel = Obj<B>;
        type Srq = Obj<B>;
        type Qp = Obj<B>;
        type Ah = FakeAh<B>;
        type Mw = FakeAh<B>;

        fn device_name(&self) -> String {
            self.device.clone()
        }
        fn query_device(&self) -> Result<DeviceAttr> {
            Err(Error::unsupported("fake has no device attributes"))
        }
        fn query_port(&self, port_num: u8) -> Result<PortAttr> {
            Err(Error::invalid(format!("fake has no port {port_num}")))
        }
        fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
            Ok(Gid([port_num.wrapping_add(index as u8); 16]))
        }
        fn query_pkey(&self, _port_num: u8, _index: u16) -> Result<u16> {
            Ok(0xFFFF)
        }
        fn alloc_pd(&self) -> Result<Obj<B>> {
            self.obj("alloc_pd".into(), "pd", 0)
        }
        fn alloc_mr(&self, pd: &Obj<B>, len: usize, _: AccessFlags) -> Result<Obj<B>> {
            self.obj(format!("alloc_mr(pd{}, {len})", pd.handle), "mr", len)
        }
        fn reg_mr_file(&self, _: &Obj<B>, path: &Path, _: usize, _: AccessFlags) -> Result<Obj<B>> {
            Err(Error::new(
                ErrorKind::Io,
                format!("cannot map {}", path.display()),
            ))
        }
        #[allow(unsafe_code)] // never touches `addr`
        unsafe fn reg_mr_raw(
            &self,
            pd: &Obj<B>,
            _addr: *mut u8,
            len: usize,
            _: AccessFlags,
        ) -> Result<Obj<B>> {
            self.obj(format!("reg_mr_raw(pd{}, {len})", pd.handle), "mr", len)
        }
        fn create_comp_channel(&self) -> Result<Obj<B>> {
            self.obj("create_comp_channel".into(), "ch", 0)
        }
        fn create_cq(&self, cqe: u32, channel: Option<&Obj<B>>) -> Result<Obj<B>> {
            let ch = channel.map(|c| c.handle);
            self.obj(format!("create_cq({cqe}, {ch:?})"), "cq", 0)
        }
        fn create_srq(&self, pd: &Obj<B>, attr: &SrqAttr) -> Result<Obj<B>> {
            let call = format!("create_srq(pd{}, {})", pd.handle, attr.max_wr);
            self.obj(call, "srq", 0)
        }
        fn create_qp(
            &self,
            pd: &Obj<B>,
            send_cq: &Obj<B>,
            recv_cq: &Obj<B>,
            srq: Option<&Obj<B>>,
            attr: &QpInitAttr,
        ) -> Result<Obj<B>> {
            let (pd, scq, rcq, srq) = (
                pd.handle,
                send_cq.handle,
                recv_cq.handle,
                srq.map(|s| s.handle),
            );
            let call = format!(
                "create_qp(pd{pd}, cq{scq}, cq{rcq}, {srq:?}, {:?})",
                attr.qp_type
            );
            self.obj(call, "qp", 0)
        }
        fn create_ah(&self, pd: &Obj<B>, attr: &AhAttr) -> Result<FakeAh<B>> {
            let call = format!("create_ah(pd{}, {})", pd.handle, attr.dgid);
            self.obj(call, "ah", 0).map(FakeAh)
        }
        fn poll_async_event(&self) -> Option<AsyncEvent> {
            None
        }
        fn alloc_mw(&self, pd: &Obj<B>, mw_type: MwType) -> Result<FakeAh<B>> {
            let call = format!("alloc_mw(pd{}, {mw_type:?})", pd.handle);
            self.obj(call, "mw", 0).map(FakeAh)
        }
        fn bind_mw(&self, qp: &Obj<B>, mw: &FakeAh<B>, bind: &MwBind) -> Result<u32> {
            let call = format!(
                "bind_mw(qp{}, mw{}, {})",
                qp.handle, mw.0.handle, bind.length
            );
            self.log.lock().unwrap().push(call);
            Ok(mw.0.handle | 0x100)
        }
    }

    impl<const B: u8> MemoryWindow for FakeAh<B> {
        fn handle(&self) -> u32 {
            self.0.handle
        }
        fn mw_type(&self) -> MwType {
            MwType::Type1
        }
        fn rkey(&self) -> u32 {
            self.0.handle
        }
        fn destroy(&self) -> Result<()> {
            self.0.ok("dealloc")
        }
    }

    /// The fake's address handle (its own type: `Obj` is every other handle).
    #[derive(Clone)]
    struct FakeAh<const B: u8>(Obj<B>);

    impl<const B: u8> AddressHandle for FakeAh<B> {
        fn handle(&self) -> u32 {
            self.0.handle
        }
        fn destroy(&self) -> Result<()> {
            self.0.ok("destroy")
        }
    }

    impl<const B: u8> ProtectionDomain for Obj<B> {
        fn handle(&self) -> u32 {
            self.handle
        }
        fn destroy(&self) -> Result<()> {
            self.ok("destroy")
        }
    }

    impl<const B: u8> MemoryRegion for Obj<B> {
        fn lkey(&self) -> u32 {
            self.handle
        }
        fn rkey(&self) -> u32 {
            self.handle | 0x100
        }
        fn addr(&self) -> u64 {
            0x1000 * u64::from(self.handle)
        }
        fn len(&self) -> usize {
            self.mem.lock().unwrap().len()
        }
        fn access(&self) -> AccessFlags {
            AccessFlags::LOCAL_WRITE
        }
        fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
            let range = self.range(offset, buf.len())?;
            buf.copy_from_slice(&self.mem.lock().unwrap()[range]);
            self.ok("read")
        }
        fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
            let range = self.range(offset, data.len())?;
            self.mem.lock().unwrap()[range].copy_from_slice(data);
            self.ok("write")
        }
        fn destroy(&self) -> Result<()> {
            self.ok("destroy")
        }
    }

    impl<const B: u8> CompletionQueue for Obj<B> {
        fn handle(&self) -> u32 {
            self.handle
        }
        fn capacity(&self) -> u32 {
            16
        }
        fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
            self.ok("poll")?;
            out[0] = WorkCompletion {
                wr_id: 7,
                qp_num: self.handle,
                ..WorkCompletion::default()
            };
            Ok(1)
        }
        fn req_notify(&self, solicited_only: bool) -> Result<()> {
            self.ok(&format!("req_notify({solicited_only})"))
        }
        fn ack_events(&self, n: u32) {
            self.ok(&format!("ack_events({n})")).unwrap();
        }
        fn resize(&self, cqe: u32) -> Result<()> {
            self.ok(&format!("resize({cqe})"))
        }
        fn destroy(&self) -> Result<()> {
            self.ok("destroy")
        }
    }

    impl<const B: u8> AsFd for Obj<B> {
        fn as_fd(&self) -> BorrowedFd<'_> {
            self.fd.as_fd()
        }
    }

    impl<const B: u8> AsRawFd for Obj<B> {
        fn as_raw_fd(&self) -> RawFd {
            self.fd.as_raw_fd()
        }
    }

    impl<const B: u8> CompletionChannel for Obj<B> {
        fn get_cq_event(&self) -> Result<Option<u32>> {
            self.ok("get_cq_event")?;
            Ok(Some(2))
        }
        fn wait_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
            self.ok(&format!("wait_cq_event({timeout:?})"))?;
            Ok(None)
        }
        fn destroy(&self) -> Result<()> {
            self.ok("destroy")
        }
    }

    impl<const B: u8> SharedReceiveQueue for Obj<B> {
        fn handle(&self) -> u32 {
            self.handle
        }
        fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
            self.ok(&format!("post_recv({})", wrs.len()))
                .map_err(|e| PostError::new(0, e))
        }
        fn query(&self) -> Result<SrqAttr> {
            self.ok("query")?;
            Ok(SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            })
        }
        fn arm_limit(&self, srq_limit: u32) -> Result<()> {
            self.ok(&format!("arm_limit({srq_limit})"))
        }
        fn destroy(&self) -> Result<()> {
            self.ok("destroy")
        }
    }

    impl<const B: u8> QueuePair for Obj<B> {
        fn qp_num(&self) -> u32 {
            self.handle
        }
        fn qp_type(&self) -> QpType {
            QpType::Rc
        }
        fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
            self.ok(&format!("modify({:?}, {:#x})", attr.qp_state, mask.bits()))
        }
        fn query(&self) -> Result<QpAttr> {
            self.ok("query")?;
            Ok(QpAttr {
                qp_state: QpState::Init,
                ..QpAttr::default()
            })
        }
        fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
            self.ok(&format!("post_send({})", wrs.len()))
                .map_err(|e| PostError::new(0, e))?;
            match wrs.len() {
                0 | 1 => Ok(()),
                _ => Err(PostError::new(1, Error::no_memory("fake send queue full"))),
            }
        }
        fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
            self.ok(&format!("post_recv({})", wrs.len()))
                .map_err(|e| PostError::new(0, e))
        }
        fn endpoint(&self, psn: u32) -> Result<Endpoint> {
            Ok(Endpoint {
                qpn: self.handle,
                psn,
                gid: Gid::default(),
                udp_port: ROCE_V2_UDP_PORT,
            })
        }
        fn destroy(&self) -> Result<()> {
            self.ok("destroy")
        }
    }

    #[derive(Clone)]
    struct FakeDevice<const B: u8>(&'static str);

    impl<const B: u8> Device for FakeDevice<B> {
        type Context = Fake<B>;

        fn name(&self) -> String {
            self.0.to_owned()
        }
        fn node_guid(&self) -> u64 {
            0x5eed_0000 + u64::from(B)
        }
        fn open(&self) -> Result<Fake<B>> {
            Ok(Fake::new(self.0))
        }
    }

    struct FakeProvider(Vec<&'static str>);

    impl Provider for FakeProvider {
        type Device = FakeDevice<2>;

        fn name(&self) -> &'static str {
            "fake-provider"
        }
        fn devices(&self) -> Result<Vec<FakeDevice<2>>> {
            Ok(self.0.iter().map(|name| FakeDevice(name)).collect())
        }
    }

    /// Generic code touching every method of every trait; returns what it observed.
    #[allow(unsafe_code)] // reg_mr_raw
    fn exercise<C: Context>(ctx: &C) -> Result<Vec<String>> {
        let lw = AccessFlags::LOCAL_WRITE;
        let mut seen = vec![
            ctx.device_name(),
            format!("{:?}", ctx.query_device()),
            format!("{:?}", ctx.query_port(1)),
            format!("{} {:#x}", ctx.query_gid(1, 2)?, ctx.query_pkey(1, 0)?),
            format!("{:?}", ctx.poll_async_event()),
        ];
        let pd = ctx.alloc_pd()?;
        let mr = ctx.alloc_mr(&pd, 64, lw)?;
        mr.write(8, b"hello")?;
        let mut buf = [0; 5];
        mr.read(8, &mut buf)?;
        seen.push(String::from_utf8_lossy(&buf).into_owned());
        seen.push(format!("{:?} {:?}", mr.read(62, &mut buf), mr.sge(8, 5)));
        let keys = (mr.lkey(), mr.rkey(), mr.addr(), mr.len(), mr.is_empty());
        seen.push(format!("{keys:?} {:?}", mr.access()));
        let mut raw = [0u8; 16];
        // SAFETY: `raw` outlives the MR, which is destroyed below; nothing else accesses it.
        let raw_mr = unsafe { ctx.reg_mr_raw(&pd, raw.as_mut_ptr(), raw.len(), lw)? };
        seen.push(format!("{}", raw_mr.len()));
        let file = ctx.reg_mr_file(&pd, Path::new("/nonexistent/mr"), 8, lw);
        seen.push(format!("{:?}", file.map(|mr| mr.len())));

        let ch = ctx.create_comp_channel()?;
        let cq = ctx.create_cq(16, Some(&ch))?;
        cq.req_notify(true)?;
        seen.push(format!("{:?}", ch.get_cq_event()?));
        seen.push(format!("{:?}", ch.wait_cq_event(Some(Duration::ZERO))?));
        cq.ack_events(1);
        cq.resize(32)?;
        let mut wc = [WorkCompletion::default(); 2];
        let n = cq.poll(&mut wc)?;
        seen.push(format!("{} {n} {:?} {}", cq.handle(), wc[0], cq.capacity()));

        let srq_attr = SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        };
        let srq = ctx.create_srq(&pd, &srq_attr)?;
        let sge = [mr.sge(0, 8)?];
        srq.post_recv(&[RecvWr::new(1, &sge)])
            .map_err(|e| e.error)?;
        srq.arm_limit(2)?;
        seen.push(format!("{} {:?}", srq.handle(), srq.query()?));

        let qp = ctx.create_qp(&pd, &cq, &cq, Some(&srq), &QpInitAttr::rc(QpCap::default()))?;
        let init = QpAttr {
            qp_state: QpState::Init,
            ..QpAttr::default()
        };
        qp.modify(&init, QpAttrMask::STATE)?;
        let wr = SendWr::new(3, SendOp::Send, &sge);
        qp.post_send(&[wr]).map_err(|e| e.error)?;
        seen.push(format!("{:?}", qp.post_send(&[wr, wr])));
        seen.push(format!("{:?}", qp.post_recv(&[])));
        seen.push(format!(
            "{} {:?} {:?}",
            qp.qp_num(),
            qp.qp_type(),
            qp.state()?
        ));
        seen.push(format!("{:?} {}", qp.query()?.qp_state, qp.endpoint(0x42)?));

        qp.destroy()?;
        srq.destroy()?;
        cq.destroy()?;
        ch.destroy()?;
        raw_mr.destroy()?;
        mr.destroy()?;
        pd.destroy()?;
        Ok(seen)
    }

    #[test]
    fn generic_code_runs_the_same_statically_and_erased() {
        let direct = Fake::<1>::new("fake0");
        let seen_direct = exercise(&direct).unwrap();

        let inner = Fake::<1>::new("fake0");
        let seen_erased = exercise(&AnyContext::new(inner.clone())).unwrap();

        assert_eq!(seen_direct, seen_erased);
        assert_eq!(direct.calls(), inner.calls());
        assert_eq!(inner.calls().len(), 31, "{:#?}", inner.calls());
        assert!(seen_erased.contains(&"hello".to_owned()));
        assert!(
            seen_erased
                .iter()
                .any(|s| s.contains("index: 1") && s.contains("NoMemory"))
        );
    }

    fn assert_foreign<T: fmt::Debug>(result: Result<T>) {
        let err = result.unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{err}");
        assert!(err.detail.contains("belongs to another provider"), "{err}");
        assert!(
            err.detail.contains("Obj<2>") && err.detail.contains("Obj<1>"),
            "{err}"
        );
    }

    #[test]
    #[allow(unsafe_code)] // reg_mr_raw
    fn handles_of_another_backend_are_invalid_arguments() {
        let mine = Fake::<1>::new("mine");
        let ctx = AnyContext::new(mine.clone());
        let other = AnyContext::new(Fake::<2>::new("other"));
        let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(4, None).unwrap());
        let opd = other.alloc_pd().unwrap();
        let ocq = other.create_cq(4, None).unwrap();
        let och = other.create_comp_channel().unwrap();
        let osrq = other.create_srq(&opd, &SrqAttr::default()).unwrap();
        let before = mine.calls();

        let lw = AccessFlags::LOCAL_WRITE;
        let attr = QpInitAttr::rc(QpCap::default());
        assert_foreign(ctx.alloc_mr(&opd, 8, lw));
        assert_foreign(ctx.reg_mr_file(&opd, Path::new("/tmp/x"), 8, lw));
        let mut buf = [0u8; 8];
        // SAFETY: `buf` outlives the call, which fails before registering anything.
        assert_foreign(unsafe { ctx.reg_mr_raw(&opd, buf.as_mut_ptr(), 8, lw) });
        assert_foreign(ctx.create_cq(4, Some(&och)));
        assert_foreign(ctx.create_srq(&opd, &SrqAttr::default()));
        assert_foreign(ctx.create_qp(&opd, &cq, &cq, None, &attr));
        assert_foreign(ctx.create_qp(&pd, &ocq, &cq, None, &attr));
        assert_foreign(ctx.create_qp(&pd, &cq, &ocq, None, &attr));
        assert_foreign(ctx.create_qp(&pd, &cq, &cq, Some(&osrq), &attr));
        assert_eq!(mine.calls(), before, "the backend must not be reached");
    }

    #[test]
    fn downcast_gives_the_concrete_types_back() {
        let any = AnyContext::new(Fake::<1>::new("a"));
        assert_eq!(any.downcast_ref::<Fake<1>>().unwrap().device, "a");
        assert!(any.downcast_ref::<Fake<2>>().is_none());
        let again = AnyContext::new(any.clone());
        assert!(again.downcast_ref::<Fake<1>>().is_some(), "wrapped twice");
        assert!(format!("{again:?}").contains("Fake<1>"));

        let pd = any.alloc_pd().unwrap();
        assert_eq!(pd.downcast_ref::<Obj<1>>().unwrap().kind, "pd");
        assert!(pd.downcast_ref::<Obj<2>>().is_none());
        assert!(format!("{pd:?}").starts_with("AnyPd(") && format!("{pd:?}").contains("Obj<1>"));
    }

    #[test]
    fn channel_fd_is_the_backends() {
        let fake = Fake::<1>::new("a");
        let ch = AnyContext::new(fake.clone()).create_comp_channel().unwrap();
        assert_eq!(ch.as_raw_fd(), fake.fd.as_raw_fd());
        assert_eq!(ch.as_fd().as_raw_fd(), fake.fd.as_raw_fd());
    }

    #[test]
    fn any_device_opens_an_any_context() {
        let dev = AnyDevice::new(FakeDevice::<2>("dev0"));
        assert_eq!(
            (dev.name(), dev.node_guid()),
            ("dev0".to_owned(), 0x5eed_0002)
        );
        let ctx = dev.open().unwrap();
        assert_eq!(ctx.device_name(), "dev0");
        assert!(ctx.downcast_ref::<Fake<2>>().is_some());
        let again = AnyDevice::new(dev.clone());
        assert!(
            again.downcast_ref::<FakeDevice<2>>().is_some(),
            "wrapped twice"
        );
        assert!(format!("{again:?}").contains("FakeDevice<2>"));
    }

    fn registry() -> Registry {
        let mut r = Registry::new();
        r.register("one", || {
            let devs = [FakeDevice::<1>("one0"), FakeDevice::<1>("one1")];
            Ok(devs.into_iter().map(AnyDevice::new).collect())
        });
        r.register("two", || Ok(vec![AnyDevice::new(FakeDevice::<2>("two0"))]));
        r.register("empty", || Ok(Vec::new()));
        r.register("broken", || Err(Error::new(ErrorKind::Io, "cannot scan")));
        r
    }

    #[test]
    fn registry_opens_by_provider_and_device_name() {
        let r = registry();
        assert_eq!(r.names(), ["one", "two", "empty", "broken"]);
        assert!(format!("{r:?}").contains("\"empty\""));
        let names: Vec<String> = r.devices("one").unwrap().iter().map(Device::name).collect();
        assert_eq!(names, ["one0", "one1"]);
        assert_eq!(r.open("one", None).unwrap().device_name(), "one0");
        let ctx = r.open("one", Some("one1")).unwrap();
        assert_eq!(ctx.device_name(), "one1");
        assert!(ctx.downcast_ref::<Fake<1>>().is_some());
        assert!(
            r.open("two", None)
                .unwrap()
                .downcast_ref::<Fake<2>>()
                .is_some()
        );
        assert_eq!(r.open("broken", None).unwrap_err().kind, ErrorKind::Io);
    }

    fn not_found(result: Result<impl fmt::Debug>, needles: &[&str]) {
        let err = result.unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
        for needle in needles {
            assert!(err.detail.contains(needle), "{needle:?} missing from {err}");
        }
    }

    #[test]
    fn not_found_errors_list_what_exists() {
        let r = registry();
        let all = ["\"three\"", "one, two, empty, broken"];
        not_found(r.open("three", None), &all);
        not_found(r.devices("three"), &all);
        not_found(
            r.open("one", Some("nope")),
            &["\"one\"", "\"nope\"", "one0, one1"],
        );
        not_found(r.open("empty", None), &["\"empty\"", "none"]);
        not_found(Registry::new().open("one", None), &["\"one\"", "none"]);
        not_found(Registry::new().open_with(None, None), &["no provider"]);
    }

    #[test]
    fn register_replaces_a_provider_in_place_and_erases_providers() {
        let mut r = registry();
        r.register("two", || Ok(vec![AnyDevice::new(FakeDevice::<1>("new"))]));
        r.register_provider(FakeProvider(vec!["p0", "p1"]));
        assert_eq!(
            r.names(),
            ["one", "two", "empty", "broken", "fake-provider"]
        );
        assert_eq!(r.open("two", None).unwrap().device_name(), "new");
        let ctx = r.open("fake-provider", Some("p1")).unwrap();
        assert_eq!(ctx.device_name(), "p1");
        assert!(ctx.downcast_ref::<Fake<2>>().is_some());
    }

    #[test]
    fn open_with_defaults_to_the_first_provider_and_device() {
        let r = registry();
        assert_eq!(r.open_with(None, None).unwrap().device_name(), "one0");
        assert_eq!(
            r.open_with(None, Some("one1")).unwrap().device_name(),
            "one1"
        );
        assert_eq!(
            r.open_with(Some("two"), None).unwrap().device_name(),
            "two0"
        );
        not_found(r.open_with(Some("bogus"), None), &["\"bogus\"", "one, two"]);
    }

    const ENV_TEST: &str = "dynamic::tests::open_from_env_reads_both_variables";

    /// Re-runs itself in a child process with the variables set, so that no thread of this
    /// process sees the environment change.
    #[test]
    fn open_from_env_reads_both_variables() {
        let mut r = registry();
        r.register("dynamic-env-test", || {
            let devs = [FakeDevice::<2>("env0"), FakeDevice::<2>("env1")];
            Ok(devs.into_iter().map(AnyDevice::new).collect())
        });
        if std::env::var(PROVIDER_ENV).as_deref() == Ok(" dynamic-env-test ") {
            let ctx = r.open_from_env("one").unwrap();
            assert_eq!(ctx.device_name(), "env1");
            assert!(ctx.downcast_ref::<Fake<2>>().is_some());
            return;
        }
        let child = Command::new(std::env::current_exe().unwrap())
            .args([ENV_TEST, "--exact", "--test-threads=1"])
            .env(PROVIDER_ENV, " dynamic-env-test ")
            .env(DEVICE_ENV, "env1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&child.stdout);
        assert!(
            child.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&child.stderr)
        );
        assert!(
            stdout.contains("1 passed"),
            "the child ran no test: {stdout}"
        );
    }

    #[test]
    fn env_values_are_trimmed_and_blank_means_unset() {
        // PATH is set in any test environment; an unlikely name is not.
        assert!(env_value("PATH").unwrap().is_some());
        assert_eq!(
            env_value("SOFTVERBS_DYNAMIC_TEST_UNSET_VARIABLE").unwrap(),
            None
        );
    }
}
