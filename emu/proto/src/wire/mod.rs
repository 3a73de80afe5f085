//! RoCEv2 wire codec (placeholder: filled by the wire-codec work).
