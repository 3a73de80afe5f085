//! Errors of the verbs API: one enum for the control path, one for posting work.

use core::fmt;

/// What went wrong, with the errno rdma-core would report for it.
///
/// The kinds follow libibverbs: every verbs call that fails returns a positive errno, and these
/// are the ones a provider uses. [`ErrorKind::errno`] gives the number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument is out of range, inconsistent, or names an object of the wrong kind
    /// (`EINVAL`).
    InvalidArgument,
    /// The object is not in a state that allows the call, e.g. posting a send in INIT or an
    /// illegal QP transition (`EINVAL`, as rdma-core reports it).
    InvalidState,
    /// A queue or table is full, or a resource limit of the device is reached (`ENOMEM`).
    NoMemory,
    /// The object is still in use by another object, e.g. destroying a CQ a QP uses
    /// (`EBUSY`).
    Busy,
    /// The backend does not implement this feature or mask bit (`EOPNOTSUPP`).
    NotSupported,
    /// No such device, port or object (`ENODEV`/`ENOENT`).
    NotFound,
    /// The handle was destroyed earlier; it can no longer be used (`EINVAL`).
    Destroyed,
    /// The operating system refused a resource (file mapping, socket, …) (`EIO`).
    Io,
}

impl ErrorKind {
    /// The positive errno libibverbs would return for this kind.
    pub const fn errno(self) -> i32 {
        match self {
            ErrorKind::InvalidArgument | ErrorKind::InvalidState | ErrorKind::Destroyed => 22,
            ErrorKind::NoMemory => 12,
            ErrorKind::Busy => 16,
            ErrorKind::NotSupported => 95,
            ErrorKind::NotFound => 19,
            ErrorKind::Io => 5,
        }
    }

    /// A short lower-case name, as used in error messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidState => "invalid state",
            ErrorKind::NoMemory => "out of resources",
            ErrorKind::Busy => "object busy",
            ErrorKind::NotSupported => "not supported",
            ErrorKind::NotFound => "not found",
            ErrorKind::Destroyed => "handle destroyed",
            ErrorKind::Io => "i/o error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed verbs call on the control path (create, modify, query, destroy).
///
/// A failed call changes nothing: the objects it named keep the state they had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {detail}")]
pub struct Error {
    /// The class of failure, mapping to an errno.
    pub kind: ErrorKind,
    /// What exactly was wrong, for a human.
    pub detail: String,
}

impl Error {
    /// An error of `kind` with a human-readable `detail`.
    pub fn new(kind: ErrorKind, detail: impl Into<String>) -> Error {
        Error {
            kind,
            detail: detail.into(),
        }
    }

    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid(detail: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, detail)
    }

    /// Shorthand for [`ErrorKind::InvalidState`].
    pub fn state(detail: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidState, detail)
    }

    /// Shorthand for [`ErrorKind::NoMemory`].
    pub fn no_memory(detail: impl Into<String>) -> Error {
        Error::new(ErrorKind::NoMemory, detail)
    }

    /// Shorthand for [`ErrorKind::Busy`].
    pub fn busy(detail: impl Into<String>) -> Error {
        Error::new(ErrorKind::Busy, detail)
    }

    /// Shorthand for [`ErrorKind::NotSupported`].
    pub fn unsupported(detail: impl Into<String>) -> Error {
        Error::new(ErrorKind::NotSupported, detail)
    }

    /// Shorthand for [`ErrorKind::Destroyed`] naming the object kind.
    pub fn destroyed(what: &str) -> Error {
        Error::new(ErrorKind::Destroyed, format!("{what} was destroyed"))
    }

    /// The errno libibverbs would return.
    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }
}

/// Result of a control-path verbs call.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// A failed `post_send`/`post_recv` batch.
///
/// As with libibverbs' `bad_wr`: work requests before `index` were posted and will complete;
/// the one at `index` and all after it were not posted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("work request {index} rejected: {error}")]
pub struct PostError {
    /// Position in the batch of the first work request that was not posted.
    pub index: usize,
    /// Why it was rejected.
    pub error: Error,
}

impl PostError {
    /// The work request at `index` was rejected with `error`.
    pub fn new(index: usize, error: Error) -> PostError {
        PostError { index, error }
    }
}
