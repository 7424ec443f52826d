//! The WAL's byte formats: frames, commit groups and segments, and the
//! object layout of a WAL kept in S3.

pub(crate) mod codec;
pub mod frame;
pub mod objects;
pub mod segment;

pub use codec::DecodeError;
pub use frame::*;
pub use objects::oldest_to_keep;
pub use segment::*;
