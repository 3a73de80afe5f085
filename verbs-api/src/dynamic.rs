//! Run-time backend selection (written next).
