//! The WAL's byte formats: frames, commit groups and segments.

pub(crate) mod codec;
pub mod frame;
pub mod segment;

pub use codec::DecodeError;
pub use frame::*;
pub use segment::*;
