//! The WAL's byte formats: frames, commit groups and segments, and the
//! object layout of a WAL kept in S3.

pub(crate) mod codec;
pub mod frame;
pub mod objects;
pub(crate) mod payload;
pub mod scan;
pub mod segment;
pub mod stream;

pub use frame::*;
pub use objects::{first_overlap, lay_out, split_leftovers, taken_key};
pub use scan::*;
pub use segment::*;
