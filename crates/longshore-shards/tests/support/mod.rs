//! Helpers shared by the shard tests (included with `mod support;`): an in-process S3 server
//! ([`s3`]) and small data makers.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod s3;

/// `len` bytes that differ per shard `seed` and per offset, so a misplaced byte shows.
pub fn shard_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}
