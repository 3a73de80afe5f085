//! Outcomes of a case and the assertions cases use to produce them.
//!
//! A case returns [`Outcome`]: `Ok(())` when it passed, [`Stop::Fail`] with a message naming the
//! source line when an expectation did not hold, [`Stop::Skip`] when the backend lacks a feature
//! the case needs (it answered `NotSupported`). `?` on a verbs call turns an unexpected error into
//! a failure at the caller's line; the macros [`ensure!`](crate::ensure),
//! [`check_eq!`](crate::check_eq) and [`fail!`](crate::fail) and the functions below express the
//! expectations, so no case needs `unwrap`.

use core::fmt;
use std::panic::Location;

use verbs_api::{Error, ErrorKind, PostError};

/// Why a case stopped before passing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// An expectation did not hold; the message says which and where.
    Fail(String),
    /// The backend lacks a feature the case needs; the message says which.
    Skip(String),
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::Fail(m) => write!(f, "FAIL: {m}"),
            Stop::Skip(m) => write!(f, "SKIP: {m}"),
        }
    }
}

/// The result of one case.
pub type Outcome = Result<(), Stop>;

impl From<Error> for Stop {
    /// An unexpected verbs error: a failure at the line of the `?`.
    #[track_caller]
    fn from(e: Error) -> Stop {
        let at = Location::caller();
        Stop::Fail(format!(
            "{}:{}: unexpected error: {e}",
            at.file(),
            at.line()
        ))
    }
}

impl From<PostError> for Stop {
    /// An unexpected posting error: a failure at the line of the `?`.
    #[track_caller]
    fn from(e: PostError) -> Stop {
        let at = Location::caller();
        Stop::Fail(format!(
            "{}:{}: unexpected post error: {e}",
            at.file(),
            at.line()
        ))
    }
}

/// A failure with `msg` at the caller's line.
#[track_caller]
pub fn failure(msg: impl fmt::Display) -> Stop {
    let at = Location::caller();
    Stop::Fail(format!("{}:{}: {msg}", at.file(), at.line()))
}

/// Fails the case with a formatted message (like `panic!`, but returning [`Stop::Fail`]).
#[macro_export]
macro_rules! fail {
    ($($arg:tt)+) => {
        return ::core::result::Result::Err($crate::check::failure(format!($($arg)+)))
    };
}

/// Fails the case unless `cond` holds; the message defaults to the condition's text.
#[macro_export]
macro_rules! ensure {
    ($cond:expr $(,)?) => {
        if !$cond {
            $crate::fail!("expected {}", stringify!($cond));
        }
    };
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            $crate::fail!($($arg)+);
        }
    };
}

/// Fails the case unless the two values are equal, printing both (`assert_eq!` for outcomes).
#[macro_export]
macro_rules! check_eq {
    ($left:expr, $right:expr $(,)?) => {
        match (&$left, &$right) {
            (l, r) => {
                if l != r {
                    $crate::fail!(
                        "{} == {} failed: {:?} != {:?}",
                        stringify!($left),
                        stringify!($right),
                        l,
                        r
                    );
                }
            }
        }
    };
    ($left:expr, $right:expr, $($arg:tt)+) => {
        match (&$left, &$right) {
            (l, r) => {
                if l != r {
                    $crate::fail!("{}: {:?} != {:?}", format!($($arg)+), l, r);
                }
            }
        }
    };
}

/// Expects `r` to fail with one of `kinds`; returns the error.
#[track_caller]
pub fn expect_err<T>(r: Result<T, Error>, kinds: &[ErrorKind], what: &str) -> Result<Error, Stop> {
    match r {
        Ok(_) => Err(failure(format!(
            "{what}: expected an error of kind {kinds:?}, but it succeeded (returned a {})",
            std::any::type_name::<T>()
        ))),
        Err(e) if kinds.contains(&e.kind) => Ok(e),
        Err(e) => Err(failure(format!(
            "{what}: expected an error of kind {kinds:?}, got {:?} ({e})",
            e.kind
        ))),
    }
}

/// Expects `r` to fail with exactly `kind`.
#[track_caller]
pub fn expect_kind<T>(r: Result<T, Error>, kind: ErrorKind, what: &str) -> Result<(), Stop> {
    expect_err(r, &[kind], what).map(drop)
}

/// Expects a post to fail at work request `index` with one of `kinds`.
#[track_caller]
pub fn expect_post_err(
    r: Result<(), PostError>,
    index: usize,
    kinds: &[ErrorKind],
    what: &str,
) -> Result<(), Stop> {
    match r {
        Ok(()) => Err(failure(format!(
            "{what}: expected the post to fail at index {index} with {kinds:?}, but it succeeded"
        ))),
        Err(e) if e.index == index && kinds.contains(&e.error.kind) => Ok(()),
        Err(e) => Err(failure(format!(
            "{what}: expected failure at index {index} with {kinds:?}, got index {} with {:?} \
             ({})",
            e.index, e.error.kind, e.error
        ))),
    }
}

/// Passes `r` through, turning `NotSupported` into [`Stop::Skip`] naming `feature`: for calls
/// a case needs but a backend may legitimately lack.
#[track_caller]
pub fn needs<T>(r: Result<T, Error>, feature: &str) -> Result<T, Stop> {
    match r {
        Err(e) if e.kind == ErrorKind::NotSupported => {
            Err(Stop::Skip(format!("backend lacks {feature}: {e}")))
        }
        other => Ok(other?),
    }
}
